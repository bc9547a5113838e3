/* Evaluation of many batches by an in-process pipeline with its stages at work at once: stage
 * k on batch i while stage k + 1 is on batch i - 1, each stage on its own thread (and core, as
 * in training). Each stage runs the very forward that gp_pipeline_evaluate runs for a batch, on
 * the same device, so the figures are the same bits; only the wall time shrinks, to about the
 * slowest stage's share. gp_pipeline_predict_batches runs it too, the last stage's outputs
 * copied out instead of scored. A device's allocator belongs to one thread: a stage copies the
 * previous stage's output into its own device's memory, and the previous stage frees it, so at
 * most two outputs per stage wait at once, which is why a pipeline under a memory limit goes
 * batch after batch instead. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/thread_name.h"
#include "pipeline/eval_overlap.h"
#include "pipeline/stage.h"

typedef struct overlap {
    gp_pipeline *p;
    int n;
    const gp_tensor *xs, *ys;
    gp_tensor *logits; /* (n) host tensors the last stage copies its output into, or NULL: scored */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int *done;      /* (K) batches stage k has put out */
    int *copied;    /* (K) batches of stage k's output the next stage has copied */
    gp_tensor *out; /* (K x 2) stage k's output of batch i at 2 k + i % 2 */
    double *loss;   /* (n) per batch, from the last stage */
    int64_t *correct, *count;
    bool failed;
    gp_status st;
    char msg[1024];
} overlap;

typedef struct overlap_job {
    overlap *o;
    int k;
} overlap_job;

/* The first failure is the one reported; every waiting stage wakes and stops. */
static void fail(overlap *o, gp_status st, int k, int i) {
    pthread_mutex_lock(&o->mu);
    if (!o->failed) {
        o->failed = true;
        o->st = st;
        snprintf(o->msg, sizeof o->msg, "stage %d, batch %d: %s", k, i, gp_last_error());
    }
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

/* Waits (holding mu) until batch i's input is there for stage k and its output has a free slot
 * (the output of batch i - 2 copied on); false when a stage failed. */
static bool wait_turn(overlap *o, int k, int i) {
    const int K = o->p->K;
    while (!o->failed && ((k > 0 && o->done[k - 1] <= i) || (k < K - 1 && o->copied[k] < i - 1)))
        pthread_cond_wait(&o->cv, &o->mu);
    return !o->failed;
}

/* Batch i's input on stage k's device: the batch's rows, or a copy of the previous output. */
static gp_status take_input(overlap *o, gp_stage *s, int k, int i, gp_tensor *in) {
    if (k == 0) return gp_stage_input_rows(s, &o->xs[i], 0, o->xs[i].shape.dim[0], in);
    const gp_tensor *prev = &o->out[2 * (k - 1) + i % 2];
    GP_TRY(gp_tensor_alloc(s->dev, GP_MEM_ACTIVATIONS, prev->shape, prev->dtype, in));
    gp_status st = gp_tensor_copy(in, prev);
    if (st != GP_OK) {
        gp_tensor_release(in);
        return st;
    }
    pthread_mutex_lock(&o->mu);
    o->copied[k - 1] = i + 1;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    return GP_OK;
}

static void *stage_eval(void *arg) {
    const overlap_job *j = arg;
    overlap *o = j->o;
    gp_pipeline *p = o->p;
    const int k = j->k, K = p->K;
    gp_stage *s = gp_worker(p, k, 0);
    gp_thread_name("gp-eval-%d", k);
    gp_stage_pin_thread(s); /* on the core the stage trains on; unpinned runs too */
    const gp_run run = {.training = false, .seed = p->m->seed};
    for (int i = 0; i < o->n; i++) {
        pthread_mutex_lock(&o->mu);
        const bool go = wait_turn(o, k, i);
        pthread_mutex_unlock(&o->mu);
        if (!go) return NULL;
        gp_tensor *slot = &o->out[2 * k + i % 2];
        gp_tensor_release(slot); /* batch i - 2's, copied on */
        gp_tensor in = {0}, y = {0};
        gp_status st = take_input(o, s, k, i, &in);
        if (st == GP_OK) st = gp_seq_forward_output(p->m, s->first, s->last, s->dev, &run, &in, &y);
        gp_tensor_release(&in);
        if (st == GP_OK && k == K - 1) {
            st = o->logits ? gp_tensor_copy(&o->logits[i], &y)
                           : gp_model_score(&y, &o->ys[i], &o->loss[i], &o->correct[i],
                                            &o->count[i]);
            gp_tensor_release(&y);
        }
        if (st != GP_OK) {
            gp_tensor_release(&y);
            fail(o, st, k, i);
            return NULL;
        }
        if (k == K - 1) continue;
        pthread_mutex_lock(&o->mu);
        *slot = y;
        o->done[k] = i + 1;
        pthread_cond_broadcast(&o->cv);
        pthread_mutex_unlock(&o->mu);
    }
    /* The last outputs are freed here, on their device's thread, once copied on. */
    pthread_mutex_lock(&o->mu);
    while (!o->failed && k < K - 1 && o->copied[k] < o->n) pthread_cond_wait(&o->cv, &o->mu);
    pthread_mutex_unlock(&o->mu);
    if (k < K - 1) {
        gp_tensor_release(&o->out[2 * k]);
        gp_tensor_release(&o->out[2 * k + 1]);
    }
    return NULL;
}

bool gp_eval_overlap_applies(const gp_pipeline *p) {
    if (p->my_stage >= 0 || p->T != 1 || p->V != 1 || p->K < 2) return false;
    for (int k = 0; k < p->K; k++) {
        gp_mem_stats ms;
        gp_device_mem_stats(p->st[k].dev, &ms);
        /* under a memory limit, batch after batch: the stages at once hold more */
        if (!gp_device_is_host(p->st[k].dev) || ms.limit) return false;
        for (int j = 0; j < k; j++)
            if (p->st[j].dev == p->st[k].dev) return false; /* one thread per device */
    }
    return true;
}

gp_status gp_eval_overlap(gp_pipeline *p, int n, const gp_tensor *xs, const gp_tensor *ys,
                          gp_tensor *logits, double *loss_sum, int64_t *ncorrect,
                          int64_t *ncount) {
    const int K = p->K;
    overlap o = {.p = p, .n = n, .xs = xs, .ys = ys, .logits = logits};
    o.done = calloc((size_t)K, sizeof *o.done);
    o.copied = calloc((size_t)K, sizeof *o.copied);
    o.out = calloc((size_t)(2 * K), sizeof *o.out);
    o.loss = calloc((size_t)n, sizeof *o.loss);
    o.correct = calloc((size_t)n, sizeof *o.correct);
    o.count = calloc((size_t)n, sizeof *o.count);
    overlap_job *jobs = calloc((size_t)K, sizeof *jobs);
    pthread_t *th = calloc((size_t)K, sizeof *th);
    gp_status st = GP_OK;
    if (!o.done || !o.copied || !o.out || !o.loss || !o.correct || !o.count || !jobs || !th)
        st = gp_error(GP_OUT_OF_MEMORY, "evaluation of %d batches over %d stages", n, K);
    int started = 0;
    if (st == GP_OK) {
        pthread_mutex_init(&o.mu, NULL);
        pthread_cond_init(&o.cv, NULL);
        for (; started < K; started++) {
            jobs[started] = (overlap_job){.o = &o, .k = started};
            if (pthread_create(&th[started], NULL, stage_eval, &jobs[started]) != 0) {
                st = gp_error(GP_INTERNAL, "evaluation: cannot start stage %d's thread", started);
                fail(&o, st, started, 0);
                break;
            }
        }
        for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
        pthread_cond_destroy(&o.cv);
        pthread_mutex_destroy(&o.mu);
        for (int i = 0; i < 2 * K; i++) gp_tensor_release(&o.out[i]); /* after a failure */
    }
    if (st == GP_OK && o.failed) st = gp_error(o.st, "%s", o.msg);
    if (st == GP_OK && !logits) { /* batch by batch, as n calls of gp_pipeline_evaluate add up */
        double l = 0;
        int64_t c = 0, m = 0;
        for (int i = 0; i < n; i++) l += o.loss[i], c += o.correct[i], m += o.count[i];
        *loss_sum = l, *ncorrect = c, *ncount = m;
    }
    free(o.done), free(o.copied), free(o.out), free(o.loss), free(o.correct), free(o.count);
    free(jobs);
    free(th);
    return st;
}
