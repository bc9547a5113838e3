/* Which OpenBLAS kernels a gpipe program runs: OpenBLAS picks them from the processor's model
 * when it loads, and on a model it does not know it falls back to SSE-only kernels (Prescott)
 * even where AVX2 or AVX-512 is there, 3-5x slower. The programs check this first thing in main
 * and restart themselves once with OPENBLAS_CORETYPE naming the kernels the processor can run.
 * Private to tools/, bench/ and tests/, like the rest of support/. */
#ifndef GP_TOOLS_BLAS_CORE_H
#define GP_TOOLS_BLAS_CORE_H

#include <stdbool.h>
#include <stddef.h>

/* OpenBLAS's own switch, read by its library constructor before main. */
#define GP_CLI_BLAS_CORETYPE_ENV "OPENBLAS_CORETYPE"
/* Set beside it by gpipe for its restarted self: the core OpenBLAS chose on its own. */
#define GP_CLI_BLAS_REPLACED_ENV "GP_BLAS_CORE_REPLACED"
/* Test hook: pretends OpenBLAS chose this core, so that the restart can be tested on processors
 * that OpenBLAS knows. Not for users: the reports then name a choice OpenBLAS did not make. */
#define GP_CLI_BLAS_DETECTED_ENV "GP_BLAS_DETECTED_CORE"

/* The processor's vector features that OpenBLAS's x86 kernels need, each true only when the
 * operating system also saves its registers (XGETBV), as __builtin_cpu_supports reports them.
 * All false on other architectures. */
typedef struct gp_cli_cpu_features {
    bool avx, avx2, fma;
    bool avx512f, avx512bw, avx512dq, avx512vl, avx512cd;
} gp_cli_cpu_features;

gp_cli_cpu_features gp_cli_cpu_features_now(void);

/* The OpenBLAS core to use instead of `chosen` (OpenBLAS's own choice, by its
 * openblas_get_corename() name), or NULL to keep it. Only an SSE-only core (Prescott, Core2,
 * Nehalem, Barcelona, ...) on a processor with AVX is replaced: SkylakeX for AVX-512
 * F+BW+DQ+VL+CD, Haswell for AVX2+FMA, Sandybridge for AVX. Any other choice (Zen or Haswell on
 * an AVX-512 processor, say) is OpenBLAS's judgement and is kept; so are names it does not know. */
const char *gp_cli_blas_core_better(const char *chosen, const gp_cli_cpu_features *f);

/* The first thing in main, before any output: when OPENBLAS_CORETYPE is unset, OpenBLAS was
 * built with DYNAMIC_ARCH (else it has one target's kernels alone) and gp_cli_blas_core_better
 * replaces its choice, sets it (and GP_BLAS_CORE_REPLACED) and executes the program's file
 * (/proc/self/exe's target) again with the same argv (argv[argc] NULL, as main's is). Returns
 * only when nothing is to be done, or when the restart failed: then it says so on stderr in one
 * line (naming `program`) and the program goes on with OpenBLAS's kernels. A core the user set
 * is never changed. */
void gp_cli_blas_core_check(const char *program, char **argv);

/* Who chose the kernels in use: "OpenBLAS", "OPENBLAS_CORETYPE" (the user, or whoever set it),
 * or "gpipe" (gp_cli_blas_core_check, with *replaced the core OpenBLAS chose itself); NULL when
 * the BLAS is not OpenBLAS. replaced may be NULL. */
const char *gp_cli_blas_core_chosen_by(const char **replaced);

/* The core in use for output lines: "Zen", or "SkylakeX (set by gpipe: OpenBLAS 0.3.21 chose
 * Prescott for this processor)". Written into buf (truncated to size); returns buf. */
#define GP_CLI_BLAS_CORE_TEXT_SIZE 128
const char *gp_cli_blas_core_text(char *buf, size_t size);

#endif
