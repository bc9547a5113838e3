/* OpenBLAS's kernel choice checked against the processor, and the restart that corrects a
 * fallback (see blas_core.h). */
#include "blas_core.h"

#include "gpipe.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* OpenBLAS extensions; another CBLAS lacks them (and then nothing here applies). */
extern char *openblas_get_corename(void) __attribute__((weak));
extern char *openblas_get_config(void) __attribute__((weak));

gp_cli_cpu_features gp_cli_cpu_features_now(void) {
    gp_cli_cpu_features f = {0};
#if defined(__x86_64__) || defined(__i386__)
    /* gcc's and clang's runtimes count a feature only when XCR0 shows the OS saves its
     * registers (YMM for AVX and AVX2, opmask and ZMM for AVX-512): what a kernel may use. */
    __builtin_cpu_init();
    f.avx = __builtin_cpu_supports("avx") != 0;
    f.avx2 = __builtin_cpu_supports("avx2") != 0;
    f.fma = __builtin_cpu_supports("fma") != 0;
    f.avx512f = __builtin_cpu_supports("avx512f") != 0;
    f.avx512bw = __builtin_cpu_supports("avx512bw") != 0;
    f.avx512dq = __builtin_cpu_supports("avx512dq") != 0;
    f.avx512vl = __builtin_cpu_supports("avx512vl") != 0;
    f.avx512cd = __builtin_cpu_supports("avx512cd") != 0;
#endif
    return f;
}

/* OpenBLAS's x86 cores whose kernels use SSE at most (driver/others/dynamic.c's names): what it
 * falls back to on a model it does not know, Prescott for Intel. */
static const char *const sse_only_cores[] = {
    "Katmai", "Coppermine", "Northwood", "Prescott",     "Banias",    "Atom",
    "Core2",  "Penryn",     "Dunnington", "Nehalem",     "Athlon",    "Opteron",
    "Nano",   "Bobcat",     "Barcelona", "Opteron_SSE3",
};

static bool sse_only(const char *core) {
    for (size_t i = 0; i < sizeof sse_only_cores / sizeof *sse_only_cores; i++)
        if (strcmp(core, sse_only_cores[i]) == 0) return true;
    return false;
}

const char *gp_cli_blas_core_better(const char *chosen, const gp_cli_cpu_features *f) {
    if (!chosen || !sse_only(chosen)) return NULL;
    /* SkylakeX rather than Cooperlake or SapphireRapids: the same sgemm kernel, and a name
     * every OpenBLAS with AVX-512 kernels knows (Debian's 0.3.21 runs its Cooperlake kernels
     * for a name it does not know, SapphireRapids included). */
    if (f->avx512f && f->avx512bw && f->avx512dq && f->avx512vl && f->avx512cd) return "SkylakeX";
    if (f->avx2 && f->fma) return "Haswell";
    if (f->avx) return "Sandybridge";
    return NULL;
}

void gp_cli_blas_core_check(const char *program, char **argv) {
    if (!openblas_get_corename || getenv(GP_CLI_BLAS_CORETYPE_ENV)) return;
    /* A build for one target has those kernels alone and ignores OPENBLAS_CORETYPE. */
    if (openblas_get_config && !strstr(openblas_get_config(), "DYNAMIC_ARCH")) return;
    const char *chosen = getenv(GP_CLI_BLAS_DETECTED_ENV);
    if (!chosen) chosen = openblas_get_corename();
    const gp_cli_cpu_features f = gp_cli_cpu_features_now();
    const char *core = gp_cli_blas_core_better(chosen, &f);
    if (!core) return;
    /* Nothing has been printed or written yet, so the new image loses nothing; the pid stays,
     * so under mpirun the rank restarts in place, before MPI_Init. The program's own path,
     * not /proc/self/exe, so that its name (ps, pgrep, top) stays; /proc/self/exe where that
     * path is gone (the file was replaced since it started). */
    if (setenv(GP_CLI_BLAS_CORETYPE_ENV, core, 1) == 0 &&
        setenv(GP_CLI_BLAS_REPLACED_ENV, chosen, 1) == 0) {
        char self[4096];
        const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n > 0) {
            self[n] = '\0';
            execv(self, argv);
        }
        execv("/proc/self/exe", argv);
    }
    const int err = errno;
    unsetenv(GP_CLI_BLAS_CORETYPE_ENV);
    unsetenv(GP_CLI_BLAS_REPLACED_ENV);
    fprintf(stderr,
            "%s: warning: OpenBLAS chose its SSE-only %s kernels for this processor; restarting "
            "with %s=%s failed (%s), so GEMMs run on the slow kernels\n",
            program, chosen, GP_CLI_BLAS_CORETYPE_ENV, core, strerror(err));
}

const char *gp_cli_blas_core_chosen_by(const char **replaced) {
    if (replaced) *replaced = NULL;
    if (!openblas_get_corename) return NULL;
    const char *set = getenv(GP_CLI_BLAS_CORETYPE_ENV);
    if (!set) return "OpenBLAS";
    /* gpipe's own setting only if it is still what gpipe would set for that choice: a value
     * changed by hand since is the user's. */
    const char *was = getenv(GP_CLI_BLAS_REPLACED_ENV);
    const gp_cli_cpu_features f = gp_cli_cpu_features_now();
    const char *would = was ? gp_cli_blas_core_better(was, &f) : NULL;
    if (!would || strcmp(would, set) != 0) return "OPENBLAS_CORETYPE";
    if (replaced) *replaced = was;
    return "gpipe";
}

const char *gp_cli_blas_core_text(char *buf, size_t size) {
    const char *replaced;
    const char *by = gp_cli_blas_core_chosen_by(&replaced);
    if (!by || strcmp(by, "gpipe") != 0) {
        snprintf(buf, size, "%s", gp_blas_corename());
        return buf;
    }
    /* "OpenBLAS 0.3.21" of "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..." */
    const char *config = openblas_get_config ? openblas_get_config() : "OpenBLAS";
    int name = (int)strcspn(config, " ");
    if (strncmp(config, "OpenBLAS ", 9) == 0) name = 9 + (int)strcspn(config + 9, " ");
    snprintf(buf, size, "%s (set by gpipe: %.*s chose %s for this processor)",
             gp_blas_corename(), name, config, replaced);
    return buf;
}
