/* Tests of the timeline recorder (src/trace): busy time and the measured bubble on a synthetic
 * GPipe fill-drain staircase against (K-1)/(M+K-1) exactly, unsorted and overlapping input,
 * begin/end from K threads, and the Chrome trace JSON and SVG writers read back and checked. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"
#include "trace/trace.h"

typedef struct ev {
    int k, kind, mb;
    double a, b;
} ev;

/* GPipe fill-drain with unit boxes: stage k forwards micro-batch m over [k+m, k+m+1); backwards
 * run in micro-batch order, the last stage first: stage k's B(m) starts at
 * (M+K-1) + (K-1-k) + m. With remat, each backward is R (1 unit) then B (2 units). Returns the
 * number of events written to out. */
static int gpipe_events(int K, int M, bool remat, ev *out) {
    int n = 0;
    int fill = M + K - 1;
    int bw = remat ? 3 : 1;
    for (int k = 0; k < K; k++)
        for (int m = 0; m < M; m++) {
            out[n++] = (ev){k, GP_TRACE_FORWARD, m, k + m, k + m + 1};
            double s = fill + (double)bw * ((K - 1 - k) + m);
            if (remat) {
                out[n++] = (ev){k, GP_TRACE_RECOMPUTE, m, s, s + 1};
                out[n++] = (ev){k, GP_TRACE_BACKWARD, m, s + 1, s + 3};
            } else {
                out[n++] = (ev){k, GP_TRACE_BACKWARD, m, s, s + 1};
            }
        }
    return n;
}

static void add_all(gp_trace *t, const ev *e, int n, uint32_t shuffle_seed) {
    int *order = malloc((size_t)n * sizeof *order);
    for (int i = 0; i < n; i++) order[i] = i;
    uint32_t x = shuffle_seed;
    for (int i = n - 1; shuffle_seed && i > 0; i--) { /* Fisher-Yates with an LCG */
        x = x * 1664525u + 1013904223u;
        int j = (int)((x >> 8) % (uint32_t)(i + 1));
        int tmp = order[i];
        order[i] = order[j];
        order[j] = tmp;
    }
    for (int i = 0; i < n; i++) {
        const ev *p = &e[order[i]];
        CHECK_OK(gp_trace_add(t, p->k, (gp_trace_kind)p->kind, p->mb, p->a, p->b, NULL));
    }
    free(order);
}

static void test_staircase_exact(void) {
    ev e[2 * 4 * 8];
    for (int K = 1; K <= 4; K++)
        for (int M = 1; M <= 8; M++) {
            gp_trace t;
            REQUIRE_OK(gp_trace_init(&t, K, M));
            add_all(&t, e, gpipe_events(K, M, false, e), 0);
            gp_trace_stage_stats ss[4];
            gp_trace_stats st;
            CHECK_OK(gp_trace_measure(&t, ss, &st));
            double theory = (double)(K - 1) / (double)(M + K - 1);
            if (st.bubble != theory || st.bubble_theory != theory)
                fprintf(stderr, "K=%d M=%d: bubble %.17g theory %.17g (expected %.17g)\n", K, M,
                        st.bubble, st.bubble_theory, theory);
            CHECK(st.bubble == theory);
            CHECK(st.bubble_theory == theory);
            CHECK(st.span == 2.0 * (M + K - 1));
            for (int k = 0; k < K; k++) {
                CHECK(ss[k].busy == 2.0 * M);
                CHECK(ss[k].idle == 2.0 * (K - 1));
                CHECK_EQ_INT(ss[k].nevents, 2 * M);
                CHECK(ss[k].by_kind[GP_TRACE_FORWARD] == M);
                CHECK(ss[k].by_kind[GP_TRACE_BACKWARD] == M);
            }
            gp_trace_free(&t);
        }
    /* K = 3, M = 4 spelled out, and the remat variant (F 1, R 1, B 2) gives the same bubble. */
    gp_trace t;
    REQUIRE_OK(gp_trace_init(&t, 3, 4));
    add_all(&t, e, gpipe_events(3, 4, true, e), 0);
    gp_trace_stage_stats ss[3];
    gp_trace_stats st;
    CHECK_OK(gp_trace_measure(&t, ss, &st));
    CHECK(st.bubble == 2.0 / 6.0);
    CHECK(st.span == 24.0);
    for (int k = 0; k < 3; k++) {
        CHECK(ss[k].busy == 16.0);
        CHECK(ss[k].by_kind[GP_TRACE_RECOMPUTE] == 4.0);
        CHECK(ss[k].by_kind[GP_TRACE_BACKWARD] == 8.0);
    }
    /* A window: the forward phase [0, 6) alone has the same bubble; [1, 3] clips boxes. */
    CHECK_OK(gp_trace_measure_window(&t, 0.0, 6.0, ss, &st));
    CHECK(st.bubble == 1.0 / 3.0);
    CHECK(ss[0].busy == 4.0 && ss[1].busy == 4.0 && ss[2].busy == 4.0);
    CHECK_OK(gp_trace_measure_window(&t, 1.0, 3.0, ss, &st));
    CHECK(ss[0].busy == 2.0 && ss[1].busy == 2.0 && ss[2].busy == 1.0);
    CHECK_FAILS(gp_trace_measure_window(&t, 3.0, 1.0, ss, &st), GP_INVALID_ARGUMENT, "t0 <= t1");
    gp_trace_free(&t);
}

static void test_unsorted_overlap(void) {
    const int K = 3, M = 4;
    ev e[64];
    int n = gpipe_events(K, M, false, e);
    /* Duplicates, sends inside the boxes, and waits over every idle gap: none changes busy. */
    int base = n;
    for (int i = 0; i < base; i += 3) {
        e[n] = e[i];
        n++;
    }
    for (int k = 0; k < K; k++) {
        for (int m = 0; m < M; m++)
            e[n++] = (ev){k, GP_TRACE_SEND, m, k + m + 0.5, k + m + 1.0};
        /* stage k idles over [0, k), [M+k, M+K-1+K-1-k) and [end - k, end) */
        double end = 2.0 * (M + K - 1);
        if (k > 0) e[n++] = (ev){k, GP_TRACE_WAIT, -1, 0, k};
        e[n++] = (ev){k, GP_TRACE_WAIT, -1, M + k, M + K - 1 + (K - 1 - k)};
        if (k > 0) e[n++] = (ev){k, GP_TRACE_WAIT, -1, end - k, end};
    }
    gp_trace t;
    REQUIRE_OK(gp_trace_init(&t, K, M));
    add_all(&t, e, n, 12345);
    gp_trace_stage_stats ss[3];
    gp_trace_stats st;
    CHECK_OK(gp_trace_measure(&t, ss, &st));
    CHECK(st.bubble == 2.0 / 6.0);
    for (int k = 0; k < K; k++) {
        CHECK(ss[k].busy == 8.0);
        CHECK(ss[k].by_kind[GP_TRACE_WAIT] == 4.0);
        CHECK(ss[k].by_kind[GP_TRACE_SEND] == 2.0);
    }
    /* Busy transfers in the gaps count; an event past the end stretches the span. */
    CHECK_OK(gp_trace_add(&t, 0, GP_TRACE_SEND, 3, 3.5, 4.5, "SEND_ACT"));
    CHECK_OK(gp_trace_add(&t, 0, GP_TRACE_RECV, 0, 5.0, 6.0, "RECV_GRAD"));
    CHECK_OK(gp_trace_add(&t, 1, GP_TRACE_OPTIMIZER, -1, 12.0, 13.0, NULL));
    CHECK_OK(gp_trace_add(&t, 2, GP_TRACE_FORWARD, 0, 2.0, 2.0, NULL)); /* zero length */
    CHECK_OK(gp_trace_measure(&t, ss, &st));
    CHECK(st.span == 13.0);
    CHECK(ss[0].busy == 9.5);
    CHECK(ss[1].busy == 9.0);
    CHECK(ss[2].busy == 8.0);
    CHECK_NEAR(st.bubble, (3.5 + 4.0 + 5.0) / 39.0, 1e-15);
    gp_trace_free(&t);
}

static void test_begin_end_errors(void) {
    gp_trace t;
    REQUIRE_OK(gp_trace_init(&t, 2, 2));
    gp_trace_set_info(&t, "gpipe", "cell");
    CHECK(strcmp(t.schedule, "gpipe") == 0 && strcmp(t.remat, "cell") == 0);
    CHECK_OK(gp_trace_begin(&t, 0, GP_TRACE_BACKWARD, 1, "outer"));
    CHECK_OK(gp_trace_begin(&t, 0, GP_TRACE_RECOMPUTE, 1, NULL));
    double t0 = gp_trace_time(&t);
    while (gp_trace_time(&t) <= t0) {
    }
    CHECK_OK(gp_trace_end(&t, 0));
    CHECK_OK(gp_trace_end(&t, 0));
    int n;
    const gp_trace_event *e = gp_trace_events(&t, 0, &n);
    CHECK_EQ_INT(n, 2);
    CHECK(e[0].kind == GP_TRACE_BACKWARD && e[1].kind == GP_TRACE_RECOMPUTE);
    CHECK(e[0].t_begin >= 0.0 && e[0].t_begin <= e[1].t_begin);
    CHECK(e[1].t_end > e[1].t_begin && e[0].t_end >= e[1].t_end);
    CHECK(strcmp(e[0].label, "outer") == 0 && e[1].label[0] == '\0');
    CHECK_EQ_INT(e[1].micro_batch, 1);

    CHECK_FAILS(gp_trace_end(&t, 1), GP_INVALID_ARGUMENT, "stage 1: end without");
    CHECK_FAILS(gp_trace_begin(&t, 2, GP_TRACE_FORWARD, 0, NULL), GP_INVALID_ARGUMENT,
                "stage 2 out of range [0, 2)");
    CHECK_FAILS(gp_trace_add(&t, -1, GP_TRACE_FORWARD, 0, 0, 1, NULL), GP_INVALID_ARGUMENT,
                "stage -1");
    CHECK_FAILS(gp_trace_add(&t, 1, GP_TRACE_FORWARD, 0, 2.0, 1.0, NULL), GP_INVALID_ARGUMENT,
                "begin <= end, got [2, 1]");
    CHECK_FAILS(gp_trace_add(&t, 1, GP_TRACE_FORWARD, 0, NAN, 1.0, NULL), GP_INVALID_ARGUMENT,
                "finite");
    CHECK_FAILS(gp_trace_add(&t, 1, GP_TRACE_FORWARD, -2, 0, 1, NULL), GP_INVALID_ARGUMENT,
                "got -2");
    CHECK_FAILS(gp_trace_add(&t, 1, GP_TRACE_NKINDS, 0, 0, 1, NULL), GP_INVALID_ARGUMENT,
                "unknown event kind");
    /* An open event is not measured; too many nested ones are refused. */
    for (int i = 0; i < GP_TRACE_MAX_OPEN; i++)
        CHECK_OK(gp_trace_begin(&t, 1, GP_TRACE_FORWARD, i, NULL));
    CHECK_FAILS(gp_trace_begin(&t, 1, GP_TRACE_FORWARD, 9, NULL), GP_INVALID_ARGUMENT,
                "already 4 events open");
    gp_trace_stage_stats ss[2];
    gp_trace_stats st;
    CHECK_OK(gp_trace_measure(&t, ss, &st));
    CHECK_EQ_INT(ss[1].nevents, 0);
    CHECK_EQ_INT(ss[0].nevents, 2);
    CHECK(ss[1].busy == 0.0);

    /* Labels are cut to fit, never inside a UTF-8 sequence. */
    char longl[80];
    memset(longl, 'x', 79);
    longl[79] = '\0';
    CHECK_OK(gp_trace_add(&t, 0, GP_TRACE_SEND, 0, 0, 1, longl));
    char utf[81] = "";
    for (int i = 0; i < 40; i++) strcat(utf, "\xc3\xa9"); /* e acute, 2 bytes */
    CHECK_OK(gp_trace_add(&t, 0, GP_TRACE_SEND, 0, 0, 1, utf));
    e = gp_trace_events(&t, 0, &n);
    CHECK_EQ_INT(strlen(e[n - 2].label), GP_TRACE_LABEL_NBYTES - 1);
    CHECK_EQ_INT(strlen(e[n - 1].label), GP_TRACE_LABEL_NBYTES - 2);

    gp_trace_reset(&t);
    gp_trace_events(&t, 0, &n);
    CHECK_EQ_INT(n, 0);
    CHECK_OK(gp_trace_measure(&t, ss, &st));
    CHECK(st.span == 0.0 && st.bubble == 0.0);
    gp_trace_free(&t);
    gp_trace_free(&t); /* safe on a zeroed struct */
    CHECK_FAILS(gp_trace_add(&t, 0, GP_TRACE_FORWARD, 0, 0, 1, NULL), GP_INVALID_ARGUMENT,
                "not initialized");
    CHECK_FAILS(gp_trace_init(&t, 0, 4), GP_INVALID_ARGUMENT, "stages must be >= 1, got 0");
    CHECK_FAILS(gp_trace_init(&t, 2, 0), GP_INVALID_ARGUMENT, "got 0");
}

/* K threads, each recording only its own stage (the intended use; TSan-clean by design). */
enum { THREAD_EVENTS = 3000 };
typedef struct worker {
    gp_trace *t;
    int k;
    int failures;
} worker;

static void *record(void *p) {
    worker *w = p;
    for (int i = 0; i < THREAD_EVENTS; i++) {
        if (gp_trace_begin(w->t, w->k, (gp_trace_kind)(i % GP_TRACE_NKINDS), i, NULL) != GP_OK)
            w->failures++;
        if (gp_trace_end(w->t, w->k) != GP_OK) w->failures++;
    }
    return NULL;
}

static void test_threads(void) {
    enum { K = 4 };
    gp_trace t;
    REQUIRE_OK(gp_trace_init(&t, K, 8));
    pthread_t th[K];
    worker w[K];
    for (int k = 0; k < K; k++) {
        w[k] = (worker){&t, k, 0};
        CHECK(pthread_create(&th[k], NULL, record, &w[k]) == 0);
    }
    for (int k = 0; k < K; k++) {
        pthread_join(th[k], NULL);
        CHECK_EQ_INT(w[k].failures, 0);
        int n;
        const gp_trace_event *e = gp_trace_events(&t, k, &n);
        CHECK_EQ_INT(n, THREAD_EVENTS);
        int bad = 0;
        for (int i = 0; i < n; i++)
            bad += e[i].stage != k || e[i].micro_batch != i || e[i].t_end < e[i].t_begin ||
                   (i > 0 && e[i].t_begin < e[i - 1].t_end);
        CHECK_EQ_INT(bad, 0);
    }
    gp_trace_free(&t);
}

/* ---------------------------------------------------------------- writers */

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) n++;
    closedir(d);
    return n;
}

static bool python_ok(void) {
    return access("tests/trace_check.py", R_OK) == 0 &&
           system("python3 -c 'import json, xml.etree.ElementTree' >/dev/null 2>&1") == 0;
}

/* The picture trace: GPipe remat K = 3, M = 4 with transfers, waits and an optimizer step. */
static int build_picture(gp_trace *t, int *nx) {
    const int K = 3, M = 4;
    ev e[64];
    int n = gpipe_events(K, M, true, e);
    REQUIRE_OK(gp_trace_init(t, K, M));
    gp_trace_set_info(t, "gpipe", "cell");
    t->bubble_simulated = 1.0 / 3.0;
    add_all(t, e, n, 7);
    int extra = 0;
    for (int k = 0; k < K; k++) {
        for (int m = 0; m < M; m++) {
            double r = 6 + 3 * (K - 1 - k + m); /* this stage's R(m) */
            if (k + 1 < K) {
                CHECK_OK(gp_trace_add(t, k, GP_TRACE_SEND, m, k + m + 1, k + m + 1.08, "SEND_ACT"));
                CHECK_OK(gp_trace_add(t, k, GP_TRACE_RECV, m, r - 0.08, r, "RECV_GRAD"));
                extra += 2;
            }
            if (k > 0) {
                CHECK_OK(gp_trace_add(t, k, GP_TRACE_RECV, m, k + m - 0.08, k + m, "RECV_ACT"));
                CHECK_OK(gp_trace_add(t, k, GP_TRACE_SEND, m, r + 3, r + 3.08, "SEND_GRAD"));
                extra += 2;
            }
        }
        double end = 24 - 3 * k; /* its last backward */
        if (k > 0) CHECK_OK(gp_trace_add(t, k, GP_TRACE_WAIT, -1, 0, k - 0.08, "RECV_ACT"));
        if (k + 1 < K) /* the last stage turns around at once */
            CHECK_OK(gp_trace_add(t, k, GP_TRACE_WAIT, -1, M + k, 6 + 3 * (K - 1 - k) - 0.08,
                                  "RECV_GRAD"));
        CHECK_OK(gp_trace_add(t, k, GP_TRACE_OPTIMIZER, -1, end + 0.08, end + 1.08,
                              "adamw <&\"'>"));
        extra += 1 + (k > 0) + (k + 1 < K);
    }
    *nx = n + extra;
    return K;
}

static void test_chrome(const char *dir) {
    gp_trace t;
    int nx;
    int K = build_picture(&t, &nx);
    char path[512];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    CHECK_OK(gp_trace_write_chrome(&t, path));
    CHECK_EQ_INT(count_entries(dir), 1); /* no temporary file left */
    char *text = gp_test_read_file(path);
    CHECK(text != NULL);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    CHECK(root != NULL);
    cJSON *evs = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
    CHECK(cJSON_IsArray(evs));
    int nthread = 0, nX = 0, found_f2 = 0, found_r1 = 0, found_opt = 0, bad = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, evs) {
        const char *ph = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "ph"));
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "name"));
        cJSON *tid = cJSON_GetObjectItemCaseSensitive(it, "tid");
        cJSON *pid = cJSON_GetObjectItemCaseSensitive(it, "pid");
        if (!ph || !name || !cJSON_IsNumber(pid) || pid->valuedouble != 0.0) {
            bad++;
            continue;
        }
        if (!strcmp(ph, "M") && !strcmp(name, "thread_name")) {
            cJSON *args = cJSON_GetObjectItemCaseSensitive(it, "args");
            char want[32];
            snprintf(want, sizeof want, "stage %d", (int)tid->valuedouble);
            const char *got = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(args, "name"));
            CHECK(got && !strcmp(got, want));
            nthread++;
        } else if (!strcmp(ph, "X")) {
            nX++;
            double ts = cJSON_GetObjectItemCaseSensitive(it, "ts")->valuedouble;
            double dur = cJSON_GetObjectItemCaseSensitive(it, "dur")->valuedouble;
            const char *cat = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "cat"));
            cJSON *args = cJSON_GetObjectItemCaseSensitive(it, "args");
            cJSON *mb = cJSON_GetObjectItemCaseSensitive(args, "micro_batch");
            if (!cat || !cJSON_IsNumber(mb) || !(dur >= 0.0) || !(ts >= 0.0)) bad++;
            /* stage 1, F2: [3, 4) s; stage 0, R1: recompute at 6 + 3*(2+1) = 15 s */
            if (!strcmp(name, "F2") && tid->valuedouble == 1.0) {
                found_f2++;
                CHECK(ts == 3e6 && dur == 1e6);
                CHECK(!strcmp(cat, "forward") && mb->valuedouble == 2.0);
            }
            if (!strcmp(name, "R1") && tid->valuedouble == 0.0) {
                found_r1++;
                CHECK(ts == 15e6 && dur == 1e6 && !strcmp(cat, "recompute"));
            }
            if (!strcmp(name, "adamw <&\"'>") && tid->valuedouble == 2.0) {
                found_opt++;
                CHECK(fabs(ts - 18.08e6) < 1e-6 && fabs(dur - 1e6) < 1e-6 && mb->valuedouble == -1.0);
            }
        }
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(nthread, K);
    CHECK_EQ_INT(nX, nx);
    CHECK_EQ_INT(found_f2, 1);
    CHECK_EQ_INT(found_r1, 1);
    CHECK_EQ_INT(found_opt, 1);
    cJSON *other = cJSON_GetObjectItemCaseSensitive(root, "otherData");
    cJSON *bm = cJSON_GetObjectItemCaseSensitive(other, "bubble_theory");
    CHECK(cJSON_IsNumber(bm) && fabs(bm->valuedouble - 1.0 / 3.0) < 1e-12);
    cJSON_Delete(root);
    free(text);
    if (python_ok()) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "python3 tests/trace_check.py chrome '%s' %d %d", path, K, nx);
        CHECK(system(cmd) == 0);
    }
    remove(path);
    gp_trace_free(&t);
}

/* Well-formedness by hand: every tag closed in order, one root, attribute values quoted and
 * without '<', '&' only as one of the five entities. Returns NULL or what is wrong. */
static const char *xml_check(const char *s) {
    const char *stack[64];
    size_t len[64];
    int depth = 0, roots = 0;
    while (*s) {
        if (*s == '&') {
            static const char *ent[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
            bool ok = false;
            for (int i = 0; i < 5; i++) ok = ok || !strncmp(s, ent[i], strlen(ent[i]));
            if (!ok) return "bare '&' in text";
            s++;
            continue;
        }
        if (*s != '<') {
            s++;
            continue;
        }
        if (!strncmp(s, "<?", 2)) {
            s = strstr(s, "?>");
            if (!s) return "unterminated <?";
            s += 2;
            continue;
        }
        if (!strncmp(s, "<!--", 4)) {
            s = strstr(s, "-->");
            if (!s) return "unterminated comment";
            s += 3;
            continue;
        }
        bool closing = s[1] == '/';
        const char *name = s + 1 + closing;
        size_t n = strcspn(name, " \t\n/>");
        if (n == 0) return "empty tag name";
        const char *p = name + n;
        char quote = 0;
        for (; *p && (quote || *p != '>'); p++) {
            if (quote) {
                if (*p == quote) quote = 0;
                else if (*p == '<') return "'<' in an attribute value";
            } else if (*p == '"' || *p == '\'') {
                quote = *p;
            } else if (*p == '=' && p[1] != '"' && p[1] != '\'') {
                return "unquoted attribute value";
            }
        }
        if (!*p) return "unterminated tag";
        if (closing) {
            if (depth == 0 || len[depth - 1] != n || strncmp(stack[depth - 1], name, n))
                return "closing tag does not match";
            depth--;
        } else if (p[-1] != '/') {
            if (depth == 0) roots++;
            if (depth == 64) return "nested too deep";
            stack[depth] = name;
            len[depth++] = n;
        } else if (depth == 0) {
            roots++;
        }
        s = p + 1;
    }
    if (depth) return "unclosed tag at the end";
    if (roots != 1) return "not exactly one root element";
    return NULL;
}

static void test_svg(const char *dir) {
    CHECK(xml_check("<a><b x=\"1\"/></a>") == NULL);
    CHECK(xml_check("<a><b></a></b>") != NULL);
    CHECK(xml_check("<a>&</a>") != NULL);
    CHECK(xml_check("<a><b>") != NULL);
    gp_trace t;
    int nx;
    build_picture(&t, &nx);
    char path[512];
    snprintf(path, sizeof path, "%s/timeline.svg", dir);
    CHECK_OK(gp_trace_write_svg(&t, path));
    CHECK_EQ_INT(count_entries(dir), 1);
    const char *keep = getenv("GP_TRACE_SVG_KEEP"); /* to look at the picture */
    if (keep) CHECK_OK(gp_trace_write_svg(&t, keep));
    char *text = gp_test_read_file(path);
    REQUIRE_OK(text ? GP_OK : GP_IO);
    const char *why = xml_check(text);
    if (why) fprintf(stderr, "SVG not well-formed: %s\n", why);
    CHECK(why == NULL);
    CHECK(!strncmp(text, "<?xml", 5) && strstr(text, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
    const char *needles[] = {
        ">forward</text>", ">backward</text>", ">recompute</text>", ">send/recv</text>",
        ">wait</text>", ">optimizer</text>", ">stage 0</text>", ">stage 2</text>",
        "K = 3 stages, M = 4 micro-batches, gpipe, remat cell: bubble measured 0.3",
        "theory 0.33, simulated 0.33", "time (ms)", ">0</text>", ">1</text>", ">2</text>",
        ">3</text>", "adamw &lt;&amp;&quot;&apos;&gt;", ">opt</text>",
    };
    for (size_t i = 0; i < sizeof needles / sizeof needles[0]; i++)
        if (!strstr(text, needles[i])) {
            fprintf(stderr, "SVG lacks \"%s\"\n", needles[i]);
            gp_test_failures++;
        }
    CHECK(strstr(text, "adamw <&") == NULL);
    /* one <rect> per event, plus the background, K row bands and 7 legend swatches */
    int nrect = 0;
    for (const char *p = text; (p = strstr(p, "<rect")); p++) nrect++;
    CHECK_EQ_INT(nrect, nx + 1 + 3 + 7);
    free(text);
    if (python_ok()) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "python3 tests/trace_check.py svg '%s' %d", path, nx + 11);
        CHECK(system(cmd) == 0);
    } else {
        printf("test_trace: python3 not found, SVG checked by the C parser only\n");
    }
    remove(path);
    /* An empty trace still draws a valid picture. */
    gp_trace_reset(&t);
    CHECK_OK(gp_trace_write_svg(&t, path));
    text = gp_test_read_file(path);
    CHECK(text && xml_check(text) == NULL && strstr(text, "no events recorded"));
    free(text);
    remove(path);
    gp_trace_free(&t);
}

static void test_write_failures(const char *dir) {
    gp_trace t;
    REQUIRE_OK(gp_trace_init(&t, 2, 2));
    CHECK_OK(gp_trace_add(&t, 0, GP_TRACE_FORWARD, 0, 0, 1, NULL));
    char path[512];
    snprintf(path, sizeof path, "%s/missing/trace.json", dir);
    CHECK_FAILS(gp_trace_write_chrome(&t, path), GP_IO, path);
    CHECK(access(path, F_OK) != 0);
    snprintf(path, sizeof path, "%s/missing/timeline.svg", dir);
    CHECK_FAILS(gp_trace_write_svg(&t, path), GP_IO, path);
    CHECK(access(path, F_OK) != 0);
    /* The rename fails (the target is a directory): the temporary file must go away. */
    snprintf(path, sizeof path, "%s/taken.svg", dir);
    CHECK(mkdir(path, 0700) == 0);
    CHECK_FAILS(gp_trace_write_svg(&t, path), GP_IO, "rename");
    CHECK_FAILS(gp_trace_write_chrome(&t, path), GP_IO, path);
    CHECK_EQ_INT(count_entries(dir), 1);
    rmdir(path);
    CHECK_FAILS(gp_trace_write_svg(&t, ""), GP_INVALID_ARGUMENT, "empty output path");
    gp_trace_free(&t);
}

int main(void) {
    test_staircase_exact();
    test_unsorted_overlap();
    test_begin_end_errors();
    test_threads();
    char dir[] = "/tmp/gp_test_trace_XXXXXX";
    REQUIRE_OK(mkdtemp(dir) ? GP_OK : GP_IO);
    test_chrome(dir);
    test_svg(dir);
    test_write_failures(dir);
    CHECK_EQ_INT(count_entries(dir), 0);
    rmdir(dir);
    return gp_test_finish("test_trace");
}
