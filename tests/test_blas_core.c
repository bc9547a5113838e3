/* The OpenBLAS core check of the tools (tools/support/blas_core.c): which of OpenBLAS's choices
 * are replaced, by what, on which processors; the features it reads against the kernel's
 * /proc/cpuinfo; and who a report says chose the core in use. */
#include <string.h>

#include "support/blas_core.h"
#include "testutil.h"

/* Equal strings, or both NULL. */
static bool same(const char *a, const char *b) {
    return a == b || (a && b && strcmp(a, b) == 0);
}

#define CHECK_STR(got, want)                                                                 \
    do {                                                                                     \
        const char *g_ = (got), *w_ = (want);                                                \
        if (!same(g_, w_)) {                                                                 \
            fprintf(stderr, "%s:%d: %s: got %s, expected %s\n", __FILE__, __LINE__, #got,   \
                    g_ ? g_ : "NULL", w_ ? w_ : "NULL");                                     \
            gp_test_failures++;                                                              \
        }                                                                                    \
    } while (0)

/* A Core 2, AVX that the OS does not save, or another architecture. */
static const gp_cli_cpu_features NONE = {0};
static const gp_cli_cpu_features AVX = {.avx = true};
static const gp_cli_cpu_features AVX2_NO_FMA = {.avx = true, .avx2 = true};
static const gp_cli_cpu_features AVX2 = {.avx = true, .avx2 = true, .fma = true};
static const gp_cli_cpu_features AVX512 = {.avx = true, .avx2 = true, .fma = true,
                                           .avx512f = true, .avx512bw = true, .avx512dq = true,
                                           .avx512vl = true, .avx512cd = true};
/* Knights Landing: AVX-512 F and CD without BW, DQ, VL (SkylakeX's kernels use VL). */
static const gp_cli_cpu_features KNL = {.avx = true, .avx2 = true, .fma = true,
                                        .avx512f = true, .avx512cd = true};

typedef struct decision_case {
    const char *chosen;
    const gp_cli_cpu_features *f;
    const char *want;
} decision_case;

static void test_decisions(void) {
    static const decision_case cases[] = {
        /* The fallback this is for: Emerald Rapids (family 6 model 207) unknown to 0.3.21. */
        {"Prescott", &AVX512, "SkylakeX"},
        {"Prescott", &KNL, "Haswell"},
        {"Prescott", &AVX2, "Haswell"},
        {"Prescott", &AVX2_NO_FMA, "Sandybridge"},
        {"Prescott", &AVX, "Sandybridge"},
        /* A processor without AVX (or an OS that does not save YMM): OpenBLAS is right. */
        {"Prescott", &NONE, NULL},
        {"Nehalem", &NONE, NULL},
        /* Every SSE-only core: the fallbacks of other vendors and families. */
        {"Katmai", &AVX512, "SkylakeX"},
        {"Coppermine", &AVX512, "SkylakeX"},
        {"Northwood", &AVX2, "Haswell"},
        {"Banias", &AVX2, "Haswell"},
        {"Atom", &AVX2, "Haswell"},
        {"Core2", &AVX2, "Haswell"},
        {"Penryn", &AVX512, "SkylakeX"},
        {"Dunnington", &AVX512, "SkylakeX"},
        {"Nehalem", &AVX, "Sandybridge"},
        {"Athlon", &AVX2, "Haswell"},
        {"Opteron", &AVX2, "Haswell"},
        {"Opteron_SSE3", &AVX2, "Haswell"},
        {"Barcelona", &AVX512, "SkylakeX"},
        {"Nano", &AVX2, "Haswell"},
        {"Bobcat", &AVX, "Sandybridge"},
        /* OpenBLAS's deliberate choices: Zen (or Haswell) on AMD's AVX-512 processors, its own
         * AVX fallbacks, and the AVX-512 cores themselves. */
        {"Zen", &AVX512, NULL},
        {"Haswell", &AVX512, NULL},
        {"Sandybridge", &AVX2, NULL},
        {"Bulldozer", &AVX2, NULL},
        {"Excavator", &AVX2, NULL},
        {"SkylakeX", &AVX512, NULL},
        {"Cooperlake", &AVX512, NULL},
        /* Names it does not know, other architectures, and no name. */
        {"Unknown", &AVX512, NULL},
        {"prescott", &AVX512, NULL},
        {"", &AVX512, NULL},
        {"NEOVERSEN1", &NONE, NULL},
        {NULL, &AVX512, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *got = gp_cli_blas_core_better(cases[i].chosen, cases[i].f);
        const char *want = cases[i].want;
        if (!same(got, want)) {
            fprintf(stderr, "%s:%d: case %zu: %s -> %s, expected %s\n", __FILE__, __LINE__, i,
                    cases[i].chosen ? cases[i].chosen : "NULL", got ? got : "NULL",
                    want ? want : "NULL");
            gp_test_failures++;
        }
    }
}

/* The flags of the first processor in /proc/cpuinfo (Linux clears those the OS does not
 * save registers for), as " flag flag ... " for whole-word search; false when there is none.
 * Read line by line: the file's size reads as 0. */
static bool cpuinfo_flags(char *out, size_t size) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return false;
    char line[8192];
    bool ok = false;
    while (!ok && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "flags", 5) != 0 || !colon) continue;
        snprintf(out, size, "%.*s ", (int)strcspn(colon + 1, "\n"), colon + 1);
        ok = true;
    }
    fclose(f);
    return ok;
}

static bool has_flag(const char *flags, const char *name) {
    char word[32];
    snprintf(word, sizeof word, " %s ", name);
    return strstr(flags, word) != NULL;
}

static void test_features(void) {
    static char flags[8192];
    if (!cpuinfo_flags(flags, sizeof flags)) {
        printf("no /proc/cpuinfo flags: features not compared\n");
        return;
    }
#if defined(__x86_64__) || defined(__i386__)
    const gp_cli_cpu_features f = gp_cli_cpu_features_now();
    CHECK_EQ_INT(f.avx, has_flag(flags, "avx"));
    CHECK_EQ_INT(f.avx2, has_flag(flags, "avx2"));
    CHECK_EQ_INT(f.fma, has_flag(flags, "fma"));
    CHECK_EQ_INT(f.avx512f, has_flag(flags, "avx512f"));
    CHECK_EQ_INT(f.avx512bw, has_flag(flags, "avx512bw"));
    CHECK_EQ_INT(f.avx512dq, has_flag(flags, "avx512dq"));
    CHECK_EQ_INT(f.avx512vl, has_flag(flags, "avx512vl"));
    CHECK_EQ_INT(f.avx512cd, has_flag(flags, "avx512cd"));
#else
    const gp_cli_cpu_features f = gp_cli_cpu_features_now();
    CHECK(!f.avx && !f.avx2 && !f.avx512f);
#endif
}

/* Who chose the core, read from the environment as a restarted program finds it. */
static void test_chosen_by(void) {
    const char *replaced = "unset";
    unsetenv(GP_CLI_BLAS_CORETYPE_ENV);
    unsetenv(GP_CLI_BLAS_REPLACED_ENV);
    CHECK_STR(gp_cli_blas_core_chosen_by(&replaced), "OpenBLAS");
    CHECK_STR(replaced, NULL);
    char text[GP_CLI_BLAS_CORE_TEXT_SIZE];
    CHECK_STR(gp_cli_blas_core_text(text, sizeof text), gp_blas_corename());

    setenv(GP_CLI_BLAS_CORETYPE_ENV, "Haswell", 1);
    CHECK_STR(gp_cli_blas_core_chosen_by(&replaced), "OPENBLAS_CORETYPE");
    CHECK_STR(replaced, NULL);

    /* gpipe's setting: the value it would set for that choice on this processor. */
    const gp_cli_cpu_features f = gp_cli_cpu_features_now();
    const char *would = gp_cli_blas_core_better("Prescott", &f);
    setenv(GP_CLI_BLAS_REPLACED_ENV, "Prescott", 1);
    if (would) {
        setenv(GP_CLI_BLAS_CORETYPE_ENV, would, 1);
        CHECK_STR(gp_cli_blas_core_chosen_by(&replaced), "gpipe");
        CHECK_STR(replaced, "Prescott");
        CHECK_STR(gp_cli_blas_core_chosen_by(NULL), "gpipe");
        gp_cli_blas_core_text(text, sizeof text);
        char want[GP_CLI_BLAS_CORE_TEXT_SIZE];
        snprintf(want, sizeof want, "%s (set by gpipe: OpenBLAS ", gp_blas_corename());
        if (strncmp(text, want, strlen(want)) != 0 ||
            !strstr(text, " chose Prescott for this processor)")) {
            fprintf(stderr, "%s:%d: the text says '%s'\n", __FILE__, __LINE__, text);
            gp_test_failures++;
        }
    } else {
        printf("no AVX here: gpipe's own setting is not checked\n");
    }
    /* A value changed since (or a marker left with a value gpipe would not set) is the user's. */
    setenv(GP_CLI_BLAS_CORETYPE_ENV, "Prescott", 1);
    CHECK_STR(gp_cli_blas_core_chosen_by(&replaced), "OPENBLAS_CORETYPE");
    CHECK_STR(replaced, NULL);
    setenv(GP_CLI_BLAS_REPLACED_ENV, "Zen", 1);
    setenv(GP_CLI_BLAS_CORETYPE_ENV, would ? would : "Haswell", 1);
    CHECK_STR(gp_cli_blas_core_chosen_by(&replaced), "OPENBLAS_CORETYPE");
    CHECK_STR(gp_cli_blas_core_text(text, sizeof text), gp_blas_corename());
    unsetenv(GP_CLI_BLAS_CORETYPE_ENV);
    unsetenv(GP_CLI_BLAS_REPLACED_ENV);
}

int main(void) {
    test_decisions();
    test_features();
    test_chosen_by();
    return gp_test_finish("test_blas_core");
}
