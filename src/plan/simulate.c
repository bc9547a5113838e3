/* The simulator: checks its inputs, validates the schedule, then replays it (replay.c) with
 * per-cell times and bytes to predict each stage's busy and idle time, the step time, the bubble
 * and each stage's peak activation memory. */
#include "plan/simulate.h"

#include <math.h>

#include "plan/validate.h"

gp_sim_cell gp_sim_cell_from_layers(const gp_layer_est *layers, int first, int end) {
    gp_sim_cell c = {0};
    if (!layers || first < 0 || end <= first) return c;
    for (int i = first; i < end; i++) {
        c.fwd_time += layers[i].fwd_time;
        c.bwd_time += layers[i].bwd_time;
        c.wgt_time += layers[i].wgt_time;
        c.keep_bytes += layers[i].keep_bytes;
        /* the memory model's per-micro-batch state: outputs plus saved tensors */
        c.state_bytes += layers[i].out_bytes + layers[i].saved_bytes;
    }
    c.in_bytes = gp_cut_bytes(layers, first);
    return c;
}

double gp_sim_shared_step(const gp_sim_stage *stages, int K, int units, double step) {
    if (!stages || units <= 0 || units >= K) return step;
    for (int u = 0; u < units; u++) {
        double busy = 0;
        for (int k = u; k < K; k += units) busy += stages[k].busy;
        step = fmax(step, busy);
    }
    return step;
}

gp_status gp_schedule_simulate(const gp_schedule *s, const gp_sim_cell *cells,
                               const gp_sim_opts *o, gp_sim_stage *stages, gp_sim_result *out) {
    if (!s || !cells || !o || !stages || !out)
        return gp_error(GP_INVALID_ARGUMENT, "simulate: NULL argument");
    int capacity = o->capacity ? o->capacity : 1;
    for (int k = 0; k < (o->cell_remat ? gp_schedule_cells(s) : 1); k++) {
        const gp_remat r = o->cell_remat ? o->cell_remat[k] : o->remat;
        if (r != GP_REMAT_CELL && r != GP_REMAT_NONE)
            return gp_error(GP_INVALID_ARGUMENT,
                            "simulate: unknown remat mode %d%s (expected %d cell or %d none)",
                            (int)r, o->cell_remat ? " of a stage" : "", GP_REMAT_CELL,
                            GP_REMAT_NONE);
    }
    if (!isfinite(o->latency) || o->latency < 0)
        return gp_error(GP_INVALID_ARGUMENT, "simulate: latency %g; expected a finite value >= 0",
                        o->latency);
    GP_TRY(gp_schedule_validate(s, capacity, NULL));
    for (int k = 0; k < gp_schedule_cells(s); k++) {
        const gp_sim_cell *c = &cells[k];
        if (!isfinite(c->fwd_time) || !isfinite(c->bwd_time) || !isfinite(c->opt_time) ||
            c->fwd_time < 0 || c->bwd_time < 0 || c->opt_time < 0)
            return gp_error(GP_INVALID_ARGUMENT,
                            "simulate: cell %d times fwd %g, bwd %g, optimizer %g; expected "
                            "finite values >= 0",
                            k, c->fwd_time, c->bwd_time, c->opt_time);
        if (!(c->wgt_time >= 0 && c->wgt_time <= c->bwd_time))
            return gp_error(GP_INVALID_ARGUMENT,
                            "simulate: cell %d weight-gradient time %g; expected 0 to its "
                            "backward's %g",
                            k, c->wgt_time, c->bwd_time);
    }
    gp_sim_opts oo = *o;
    oo.capacity = capacity;
    return gp_schedule_replay(s, capacity, cells, &oo, stages, out, NULL);
}
