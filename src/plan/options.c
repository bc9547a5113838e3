/* The one check of the pipeline options: what gp_plan_make and gp_pipeline_new check first, and
 * what the command line checks its options with. Every message starts with the field at fault,
 * so that a front end can show its own name for it (the CLI's --micro-batches for
 * micro_batches) and say the rest as the library does. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "kernels/devices.h"
#include "kernels/kernels.h"
#include "plan/options.h"

/* "<name> <what>" as the message, name in *field; returns s. */
static gp_status bad(const char **field, const char *name, gp_status s, const char *fmt, ...)
    GP_PRINTF(4, 5);
static gp_status bad(const char **field, const char *name, gp_status s, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (field) *field = name;
    return gp_error(s, "%s %s", name, what);
}

gp_pipeline_sizes gp_pipeline_opts_sizes(const gp_pipeline_opts *po) {
    gp_pipeline_sizes z = {
        .stages = po->stages ? po->stages : 1,
        .micro_batches = po->micro_batches ? po->micro_batches : 1,
        .tensor_parallel = po->tensor_parallel ? po->tensor_parallel : 1,
        .data_parallel = po->data_parallel ? po->data_parallel : 1,
        .chunks = 1,
    };
    if (gp_schedule_kind_chunks(po->schedule, po->chunks, &z.chunks) != GP_OK) z.chunks = 1;
    return z;
}

/* What needs neither the model nor the batch: each field on its own, or two together. */
static gp_status check_fields(const gp_pipeline_opts *po, const gp_pipeline_sizes *z,
                              const char **field) {
    const gp_status inv = GP_INVALID_ARGUMENT;
    if (z->stages < 1) return bad(field, "stages", inv, "%d: expected at least 1", z->stages);
    if (z->micro_batches < 1)
        return bad(field, "micro_batches", inv, "%d: expected at least 1", z->micro_batches);
    if (z->tensor_parallel < 1 || z->tensor_parallel > GP_MAX_DEVICES)
        return bad(field, "tensor_parallel", inv, "%d: expected 1 to %d", z->tensor_parallel,
                   GP_MAX_DEVICES);
    if (z->data_parallel < 1 || z->data_parallel > GP_MAX_DEVICES)
        return bad(field, "data_parallel", inv, "%d: expected 1 to %d", z->data_parallel,
                   GP_MAX_DEVICES);
    if ((unsigned)po->schedule > GP_SCHEDULE_ZBV)
        return bad(field, "schedule", inv,
                   "%d: expected gpipe (%d), 1f1b (%d), zbh1 (%d), interleaved (%d) or zbv (%d)",
                   (int)po->schedule, GP_SCHEDULE_GPIPE, GP_SCHEDULE_1F1B, GP_SCHEDULE_ZBH1,
                   GP_SCHEDULE_INTERLEAVED, GP_SCHEDULE_ZBV);
    if (po->chunks < 0)
        return bad(field, "chunks", inv, "%d: expected 0 (the schedule's default) or more",
                   po->chunks);
    int V;
    if (gp_schedule_kind_chunks(po->schedule, po->chunks, &V) != GP_OK) {
        if (field) *field = "chunks";
        return gp_error_context(inv, "chunks %d", po->chunks);
    }
    if (po->schedule == GP_SCHEDULE_INTERLEAVED && z->micro_batches % z->stages != 0)
        return bad(field, "micro_batches", inv,
                   "%d: not a multiple of the %d stages (interleaved runs its cells in rounds of "
                   "K micro-batches)",
                   z->micro_batches, z->stages);
    if (po->remat != GP_REMAT_CELL && po->remat != GP_REMAT_NONE &&
        po->remat != GP_REMAT_SELECTIVE)
        return bad(field, "remat", inv, "%d: expected cell (%d), none (%d) or selective (%d)",
                   (int)po->remat, GP_REMAT_CELL, GP_REMAT_NONE, GP_REMAT_SELECTIVE);
    if (po->balance != GP_BALANCE_COST && po->balance != GP_BALANCE_TIME)
        return bad(field, "balance", inv, "%d: expected cost (%d) or time (%d)", (int)po->balance,
                   GP_BALANCE_COST, GP_BALANCE_TIME);
    if (po->balance == GP_BALANCE_TIME && z->tensor_parallel > 1)
        return bad(field, "balance", GP_UNSUPPORTED,
                   "time with %d tensor-parallel shards: a shard layer cannot be timed alone (it "
                   "needs its group); balance by cost",
                   z->tensor_parallel);
    if (po->grad_sum != GP_GRAD_SUM_SEQUENTIAL && po->grad_sum != GP_GRAD_SUM_TREE)
        return bad(field, "grad_sum", inv, "%d: expected sequential (%d) or tree (%d)",
                   (int)po->grad_sum, GP_GRAD_SUM_SEQUENTIAL, GP_GRAD_SUM_TREE);
    if (po->precision != GP_PRECISION_FP32 && po->precision != GP_PRECISION_BF16)
        return bad(field, "precision", inv, "%d: expected fp32 (%d) or bf16 (%d)",
                   (int)po->precision, GP_PRECISION_FP32, GP_PRECISION_BF16);
    if (po->launcher != GP_LAUNCHER_THREADS && po->launcher != GP_LAUNCHER_MPI)
        return bad(field, "launcher", inv, "%d: expected threads (%d) or mpi (%d)",
                   (int)po->launcher, GP_LAUNCHER_THREADS, GP_LAUNCHER_MPI);
    if (po->gpu_comm != GP_GPU_COMM_AUTO && po->gpu_comm != GP_GPU_COMM_NCCL &&
        po->gpu_comm != GP_GPU_COMM_MPI)
        return bad(field, "gpu_comm", inv, "%d: expected auto (%d), nccl (%d) or mpi (%d)",
                   (int)po->gpu_comm, GP_GPU_COMM_AUTO, GP_GPU_COMM_NCCL, GP_GPU_COMM_MPI);
    if (po->gpu_comm == GP_GPU_COMM_NCCL && po->launcher != GP_LAUNCHER_MPI)
        return bad(field, "gpu_comm", inv, "nccl: NCCL runs between the MPI launcher's ranks "
                                           "(launcher mpi), not between threads");
    if (po->stage_threads < 0 || po->stage_threads > GP_MAX_STAGE_THREADS)
        return bad(field, "stage_threads", inv, "%d: expected 0 (one) to %d", po->stage_threads,
                   GP_MAX_STAGE_THREADS);
    const gp_device_entry *kind;
    if (gp_device_registry_get(po->device_type, &kind) != GP_OK) {
        if (field) *field = "device_type";
        return gp_error_context(inv, "device_type");
    }
    if (!(po->comm_timeout_s >= 0))
        return bad(field, "comm_timeout_s", inv, "%g: expected >= 0 (0: 60 s)", po->comm_timeout_s);
    if (gp_kernels_check_smoothing(po->label_smoothing) != GP_OK)
        return bad(field, "label_smoothing", inv, "%g: expected in [0, 1)", po->label_smoothing);
    if (!(po->link_gbytes_per_s >= 0) || !isfinite(po->link_gbytes_per_s))
        return bad(field, "link_gbytes_per_s", inv, "%g: expected a finite bandwidth >= 0 (0: "
                   "the collectives' bytes are not timed)",
                   po->link_gbytes_per_s);
    if (!(po->optim_s_per_param >= 0) || !isfinite(po->optim_s_per_param))
        return bad(field, "optim_s_per_param", inv,
                   "%g: expected a finite time >= 0 (0: the optimizer step is not modelled)",
                   po->optim_s_per_param);
    if (!(po->action_s >= 0) || !isfinite(po->action_s))
        return bad(field, "action_s", inv,
                   "%g: expected a finite time >= 0 (0: the actions' hand-offs are not modelled)",
                   po->action_s);
    return GP_OK;
}

gp_status gp_pipeline_opts_check(const gp_model *m, int64_t batch, const gp_pipeline_opts *po,
                                 const char **field) {
    if (field) *field = NULL;
    if (!po) return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_opts_check: NULL options");
    const gp_pipeline_sizes z = gp_pipeline_opts_sizes(po);
    GP_TRY(check_fields(po, &z, field));
    const gp_status inv = GP_INVALID_ARGUMENT;
    const int L = m ? gp_model_nlayers(m) : 0;
    if (m && L < 1) return gp_error(inv, "the model has no layers");
    if (m && z.stages > L)
        return bad(field, "stages", inv,
                   "%d: more than the model's %d layer%s (each stage needs at least one)",
                   z.stages, L, L == 1 ? "" : "s");
    if (m && (int64_t)z.stages * z.chunks > L)
        return bad(field, "stages", inv,
                   "%d x %d cells per stage: more than the model's %d layers (each cell needs at "
                   "least one)",
                   z.stages, z.chunks, L);
    if (batch < 0)
        return bad(field, "batch", inv, "%lld: expected >= 0 (0: not known)", (long long)batch);
    if (batch > 0 && batch % ((int64_t)z.micro_batches * z.data_parallel) != 0)
        return z.data_parallel > 1
                   ? bad(field, "batch", inv,
                         "%lld: does not divide into %d replicas x %d micro-batches (each replica "
                         "takes its slice)",
                         (long long)batch, z.data_parallel, z.micro_batches)
                   : bad(field, "micro_batches", inv,
                         "%d: does not divide the batch of %lld examples", z.micro_batches,
                         (long long)batch);
    return GP_OK;
}
