/* The mesh `gpipe launch` restarts on: the same mini-batch and micro-batches on fewer processes.
 * Fewer stages first, D and T kept, since the bits do not depend on K; where no K fits, the plan
 * search's fastest plan on as many processes as fit (D or T change, and with them the bits).
 * Every candidate is checked by the library's planner (gp_plan_search), never by rules of its
 * own here: layers per cell, the schedule's constraints, the memory limit. */
#include <stdio.h>
#include <string.h>

#include "launch.h"

/* The fastest plan of n devices with T shards, D replicas of M micro-batches; stages K (0: any). */
static bool search(const gp_cli_layout_ctx *c, int n, int K, int D, int T, int M, double gflops,
                   gp_cli_layout *best) {
    const gp_pipeline_opts base = {.memory_limit = c->memory_limit,
                                   .stage_threads = c->threads,
                                   .tensor_parallel = T,
                                   .balance = GP_BALANCE_COST};
    const gp_plan_search_opts so = {.devices = n,
                                    .stages = K,
                                    .data_parallel = D,
                                    .micro_batches = M,
                                    .schedules = 1u << c->schedule,
                                    .chunks = c->chunks,
                                    .remats = 1u << c->remat,
                                    .max_plans = 1};
    gp_plan_search_result r = {0};
    bool ok = gp_plan_search(c->model, c->batch, &c->optim, &base, gflops, &so, &r) == GP_OK &&
              r.n > 0;
    if (ok)
        *best = (gp_cli_layout){r.plans[0].data_parallel, r.plans[0].stages,
                                r.plans[0].tensor_parallel, M};
    gp_plan_search_free(&r);
    return ok;
}

bool gp_cli_launch_layout(const gp_cli_layout_ctx *c, const gp_cli_layout *cur, int avail,
                          int min_np, gp_cli_layout *out, char *why, size_t why_size) {
    /* One candidate each: the rate only scales the predicted times. */
    for (int K = cur->K - 1; K >= 1; K--) {
        if ((long long)cur->D * K * cur->T > avail) continue;
        if (search(c, cur->D * K * cur->T, K, cur->D, cur->T, cur->M, 1.0, out)) return true;
    }
    /* D or T must change: the fastest plan needs the machine's rate against the links'. */
    double gflops = 0;
    char err[256];
    if (!gp_cli_bench_sgemm(512, 512, 512, c->threads, false, 2, &gflops, err, sizeof err))
        gflops = 1.0;
    /* The same micro-batches: G of them in all, each replica taking G / D in a row. */
    const int G = cur->D * cur->M;
    for (int n = avail; n >= min_np && n >= 1; n--)
        for (int T = cur->T; T >= 1; T--)
            for (int D = n / T; D >= 1; D--)
                if (n % (D * T) == 0 && G % D == 0 &&
                    search(c, n, n / (D * T), D, T, G / D, gflops, out))
                    return true;
    snprintf(why, why_size,
             "no mesh of %d to %d processes trains this model with --batch %lld in %d "
             "micro-batches (%s)",
             min_np, avail, (long long)c->batch, cur->D * cur->M, gp_last_error());
    return false;
}
