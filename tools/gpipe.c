/* The gpipe command-line tool: `gpipe train`, `eval`, `sample`, `plan`, `bench`, `import` and
 * `export`, plus --help and --version. Exit status 0 on success, 1 on a runtime failure (with
 * the library's message), 2 on bad usage. */
#include <string.h>

#include "cli.h"

static void print_help(void) {
    printf("Usage: gpipe COMMAND [options]\n"
           "       gpipe --help | --version\n\n"
           "Trains networks written as a sequence of layers (GPipe pipeline parallelism).\n\n"
           "Commands:\n"
           "  train   train a model: the Fashion-MNIST convnet, the Transformer language model,\n"
           "          or a JSON model file (gpipe train --help)\n"
           "  eval    evaluate a checkpoint (gpipe eval --help)\n"
           "  sample  generate text from a language model's checkpoint (gpipe sample --help)\n"
           "  plan    partition a model into pipeline cells and predict step time, bubble\n"
           "          and memory per cell, without training (gpipe plan --help)\n"
           "  bench   measure the G1, T1 and C1 workloads (gpipe bench --help)\n"
           "  import  convert a Hugging Face GPT-2 into gpipe's parameters (gpipe import --help)\n"
           "  export  write a gpt2 model as a Hugging Face GPT-2 (gpipe export --help)\n\n"
           "Options:\n"
           "  -h, --help      show this help and exit\n"
           "  -V, --version   print the version, the OpenBLAS kernels and the variant of gpipe's\n"
           "                  CPU kernels in use, and exit\n\n"
           "Environment:\n"
           "  OPENBLAS_CORETYPE  the OpenBLAS kernels to run (Haswell, SkylakeX, Zen, ...).\n"
           "      Unset, OpenBLAS picks them by the processor's model, and falls back to\n"
           "      SSE-only kernels on a model it does not know; gpipe then sets it to the\n"
           "      kernels the processor can run (SkylakeX, Haswell or Sandybridge) and\n"
           "      restarts itself (--version says so). A value that is set is kept: set it\n"
           "      to OpenBLAS's own choice to turn this off.\n"
           "  GP_CPU_ISA      the variant of gpipe's CPU kernels: baseline, avx2, avx512, or\n"
           "                  native in a -DGP_NATIVE=ON build (default: the fastest this CPU\n"
           "                  runs; --version lists them)\n\n"
           "Exit status: 0 success, 1 runtime failure, 2 bad usage.\n");
}

int main(int argc, char **argv) {
    /* First: it may restart the program, which loses anything done before it. */
    gp_cli_blas_core_check("gpipe", argv);
    if (argc < 2) {
        fprintf(stderr, "gpipe: missing command (expected train, eval, sample, plan, bench, import or "
                        "export)\n"
                        "Try 'gpipe --help'.\n");
        return GP_CLI_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
        print_help();
        return GP_CLI_EXIT_OK;
    }
    /* A GP_CPU_ISA that cannot run stops every command before it starts. */
    const char *isa;
    if (gp_cpu_isa(&isa) != GP_OK) {
        fprintf(stderr, "gpipe: %s\n", gp_last_error());
        return GP_CLI_EXIT_RUNTIME;
    }
    if (strcmp(cmd, "-V") == 0 || strcmp(cmd, "--version") == 0) {
        char core[GP_CLI_BLAS_CORE_TEXT_SIZE];
        printf("gpipe %s, BLAS core %s, CPU kernels %s\n", gp_version(),
               gp_cli_blas_core_text(core, sizeof core), isa);
        printf("CPU kernel variants this CPU runs: %s\n", gp_cpu_isa_runnable());
        return GP_CLI_EXIT_OK;
    }
    /* train and bench may have started MPI: it ends here, after everything is freed (or, after
     * a failure, ends every rank: peers may be waiting on this one). */
    if (strcmp(cmd, "train") == 0 || strcmp(cmd, "bench") == 0) {
        int rc = cmd[0] == 't' ? gp_cli_train_main(argc, argv) : gp_cli_bench_main(argc, argv);
        if (rc == GP_CLI_EXIT_RUNTIME) gp_cli_mpi_abort(rc);
        gp_mpi_finalize();
        return rc;
    }
    if (strcmp(cmd, "eval") == 0) return gp_cli_eval_main(argc, argv);
    if (strcmp(cmd, "sample") == 0) return gp_cli_sample_main(argc, argv);
    if (strcmp(cmd, "plan") == 0) return gp_cli_plan_main(argc, argv);
    if (strcmp(cmd, "import") == 0) return gp_cli_import_main(argc, argv);
    if (strcmp(cmd, "export") == 0) return gp_cli_export_main(argc, argv);
    fprintf(stderr,
            "gpipe: unknown %s '%s' (expected train, eval, sample, plan, bench, import, export, "
            "--help or --version)\n"
            "Try 'gpipe --help'.\n",
            cmd[0] == '-' ? "option" : "command", cmd);
    return GP_CLI_EXIT_USAGE;
}
