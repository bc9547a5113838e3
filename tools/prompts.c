/* The prompts of `gpipe train --sample N --prompts FILE`: one prompt per line of a small UTF-8
 * text file, read and checked before training starts, so a bad file fails in a second rather
 * than after a long run. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

enum { PROMPTS_MAX_BYTES = 64 * 1024 };

static int prompts_error(const char *cmd, const char *path, const char *what) {
    return gp_cli_usage_error(cmd, "--prompts %s: %s", path, what);
}

int gp_cli_read_prompts(const char *cmd, const char *path, gp_cli_prompts *out) {
    *out = (gp_cli_prompts){0};
    /* O_NONBLOCK: opening a FIFO for reading must not wait for a writer. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return prompts_error(cmd, path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return prompts_error(cmd, path, "not a regular file (expected a text file, one prompt per line)");
    }
    if (st.st_size > PROMPTS_MAX_BYTES) {
        close(fd);
        return prompts_error(cmd, path, "larger than 64 KiB (expected a few short prompts)");
    }
    char *text = malloc((size_t)st.st_size + 1);
    if (!text) {
        close(fd);
        return gp_cli_fail(cmd, "--prompts: out of host memory");
    }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, text + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    text[got] = '\0';
    if (memchr(text, '\0', got)) {
        free(text);
        return prompts_error(cmd, path, "contains a NUL byte (expected text)");
    }
    /* Lines in place: each '\n' becomes the end of its prompt; empty lines and lines starting
     * with '#' are skipped. */
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        if (end) *end = '\0';
        size_t len = strlen(line);
        if (len && line[len - 1] == '\r') line[--len] = '\0';
        if (len && line[0] != '#') {
            if (out->n == GP_CLI_MAX_PROMPTS) {
                free(text);
                *out = (gp_cli_prompts){0};
                return prompts_error(cmd, path, "more than 32 prompts");
            }
            out->text[out->n++] = line;
        }
        if (!end) break;
        line = end + 1;
    }
    if (out->n == 0) {
        free(text);
        return prompts_error(cmd, path, "no prompt in it (every line is empty or a # comment)");
    }
    out->buffer = text;
    return GP_CLI_EXIT_OK;
}

void gp_cli_prompts_free(gp_cli_prompts *p) {
    free(p->buffer);
    *p = (gp_cli_prompts){0};
}
