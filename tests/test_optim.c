/* Optimizers: learning-rate schedule values, one SGD and AdamW update
 * against the formulas computed in double, clipping, option validation, the planner's timing
 * of a step. */
#include <math.h>
#include <string.h>

#include "optim/optim.h"
#include "testutil.h"

static void test_schedule(void) {
    gp_optim_opts o = gp_adamw_defaults(1e-3f, 0.0f);
    o.warmup_steps = 10;
    o.total_steps = 110;
    o.min_lr = 1e-4f;
    CHECK_NEAR(gp_optim_lr_at(&o, 0), 1e-4, 1e-9);
    CHECK_NEAR(gp_optim_lr_at(&o, 4), 5e-4, 1e-9);
    CHECK_NEAR(gp_optim_lr_at(&o, 9), 1e-3, 1e-9);
    CHECK_NEAR(gp_optim_lr_at(&o, 10), 1e-3, 1e-9);
    CHECK_NEAR(gp_optim_lr_at(&o, 60), 1e-4 + 0.5 * 9e-4, 1e-9); /* half way: cos = 0 */
    CHECK_NEAR(gp_optim_lr_at(&o, 110), 1e-4, 1e-9);
    CHECK_NEAR(gp_optim_lr_at(&o, 500), 1e-4, 1e-9);
    gp_optim_opts c = gp_sgd_defaults(0.05f, 0.9f);
    CHECK_NEAR(gp_optim_lr_at(&c, 0), 0.05, 1e-9);
    CHECK_NEAR(gp_optim_lr_at(&c, 1000), 0.05, 1e-9);
    /* lr_cycles 0 and 1: the one cosine above */
    for (int n = 0; n <= 1; n++) {
        gp_optim_opts one = o;
        one.lr_cycles = n;
        for (int s = 0; s < 120; s += 7) CHECK(gp_optim_lr_at(&one, s) == gp_optim_lr_at(&o, s));
    }
}

/* Warm restarts: 120 steps in 2 cycles of 60, the warm-up in the first; 3 cycles of 100 steps
 * start at 33 and 66. */
static void test_schedule_cycles(void) {
    const double PI = 3.14159265358979323846;
    gp_optim_opts o = gp_sgd_defaults(1e-3f, 0.9f);
    o.warmup_steps = 10;
    o.total_steps = 120;
    o.min_lr = 1e-4f;
    o.lr_cycles = 2;
    CHECK_OK(gp_optim_check(&o));
    CHECK_NEAR(gp_optim_lr_at(&o, 4), 5e-4, 1e-9);        /* warm-up */
    CHECK_NEAR(gp_optim_lr_at(&o, 10), 1e-3, 1e-9);       /* the first cycle's top */
    CHECK_NEAR(gp_optim_lr_at(&o, 35), 1e-4 + 0.5 * 9e-4, 1e-9); /* its middle: cos = 0 */
    CHECK_NEAR(gp_optim_lr_at(&o, 59), 1e-4 + 0.5 * 9e-4 * (1 + cos(PI * 49.0 / 50)), 1e-9);
    CHECK_NEAR(gp_optim_lr_at(&o, 60), 1e-3, 1e-9);       /* the restart, without a warm-up */
    CHECK_NEAR(gp_optim_lr_at(&o, 90), 1e-4 + 0.5 * 9e-4, 1e-9);
    CHECK_NEAR(gp_optim_lr_at(&o, 119), 1e-4 + 0.5 * 9e-4 * (1 + cos(PI * 59.0 / 60)), 1e-9);
    CHECK_NEAR(gp_optim_lr_at(&o, 500), 1e-4, 1e-9);
    o.lr_cycles = 3;
    o.total_steps = 100;
    o.warmup_steps = 0;
    CHECK_NEAR(gp_optim_lr_at(&o, 0), 1e-3, 1e-9);
    CHECK(gp_optim_lr_at(&o, 32) < 2e-4f);
    CHECK_NEAR(gp_optim_lr_at(&o, 33), 1e-3, 1e-9);
    CHECK_NEAR(gp_optim_lr_at(&o, 49), 1e-4 + 0.5 * 9e-4 * (1 + cos(PI * 16.0 / 33)), 1e-9);
    CHECK_NEAR(gp_optim_lr_at(&o, 66), 1e-3, 1e-9);
    CHECK_NEAR(gp_optim_lr_at(&o, 83), 1e-4 + 0.5 * 9e-4 * (1 + cos(PI * 17.0 / 34)), 1e-9);
    /* refused: a negative count, cycles no longer than the warm-up */
    o.lr_cycles = -1;
    CHECK_FAILS(gp_optim_check(&o), GP_CONFIG, "learning-rate cycles");
    o.lr_cycles = 4;
    o.warmup_steps = 25;
    CHECK_FAILS(gp_optim_check(&o), GP_CONFIG, "longer than the 25 warm-up steps");
    o.warmup_steps = 24;
    CHECK_OK(gp_optim_check(&o));
}

/* A flat run of n elements as a store holds it: values, gradients, the optimizer's states. */
typedef struct flat {
    int n;
    bool decay;
    gp_device *dev;
    gp_tensor value, grad, state[2];
} flat;

static flat make_param(gp_device *d, int n, bool decay) {
    flat p = {.n = n, .decay = decay, .dev = d};
    REQUIRE_OK(gp_tensor_alloc(d, GP_MEM_PARAMS, gp_shape1(n), GP_F32, &p.value));
    REQUIRE_OK(gp_tensor_alloc(d, GP_MEM_GRADS, gp_shape1(n), GP_F32, &p.grad));
    for (int i = 0; i < n; i++) {
        F32(p.value)[i] = 0.5f - 0.1f * (float)i;
        F32(p.grad)[i] = 0.3f * (float)(i + 1) - 0.7f;
    }
    return p;
}

static void state_init(const gp_optim_opts *o, flat *p) {
    for (int k = 0; k < gp_optim_state_count(o); k++)
        REQUIRE_OK(gp_tensor_zeros(p->dev, GP_MEM_OPTIM, gp_shape1(p->n), GP_F32, &p->state[k]));
}

static void update(const gp_optim_opts *o, flat *p, float lr, int t) {
    float *state[2] = {F32(p->state[0]), F32(p->state[1])};
    REQUIRE_OK(gp_optim_update(o, p->dev, p->n, F32(p->value), F32(p->grad), state, p->decay,
                               lr, t));
}

static void release_param(flat *p) {
    gp_tensor_release(&p->value);
    gp_tensor_release(&p->grad);
    gp_tensor_release(&p->state[0]);
    gp_tensor_release(&p->state[1]);
}

static void test_adamw(gp_device *d) {
    gp_optim_opts o = gp_adamw_defaults(1e-2f, 0.1f);
    flat p = make_param(d, 5, true);
    state_init(&o, &p);
    double w[5], m[5] = {0}, v[5] = {0};
    for (int i = 0; i < 5; i++) w[i] = F32(p.value)[i];
    for (int t = 1; t <= 3; t++) {
        update(&o, &p, 1e-2f, t);
        for (int i = 0; i < 5; i++) {
            double g = F32(p.grad)[i];
            w[i] *= 1 - 1e-2 * 0.1;
            m[i] = 0.9 * m[i] + 0.1 * g;
            v[i] = 0.999 * v[i] + 0.001 * g * g;
            double mh = m[i] / (1 - pow(0.9, t)), vh = v[i] / (1 - pow(0.999, t));
            w[i] -= 1e-2 * mh / (sqrt(vh) + 1e-8);
        }
    }
    for (int i = 0; i < 5; i++) CHECK_NEAR(F32(p.value)[i], w[i], 1e-6);
    /* No decay on a parameter flagged decay = false. */
    flat q = make_param(d, 3, false);
    state_init(&o, &q);
    float before = F32(q.value)[0];
    update(&o, &q, 1e-2f, 1);
    double g = F32(q.grad)[0];
    CHECK_NEAR(F32(q.value)[0], before - 1e-2 * (g / (fabs(g) + 1e-8)), 1e-6);
    release_param(&p);
    release_param(&q);
}

static void test_sgd(gp_device *d) {
    gp_optim_opts o = gp_sgd_defaults(0.05f, 0.9f);
    o.weight_decay = 5e-4f;
    flat p = make_param(d, 4, true);
    state_init(&o, &p);
    gp_mem_stats st;
    gp_device_mem_stats(d, &st);
    CHECK_EQ_INT(st.live[GP_MEM_OPTIM], 16);
    double w[4], buf[4] = {0};
    for (int i = 0; i < 4; i++) w[i] = F32(p.value)[i];
    for (int t = 1; t <= 3; t++) {
        update(&o, &p, 0.05f, t);
        for (int i = 0; i < 4; i++) {
            double dd = F32(p.grad)[i] + 5e-4 * w[i];
            buf[i] = 0.9 * buf[i] + dd;
            w[i] -= 0.05 * buf[i];
        }
    }
    for (int i = 0; i < 4; i++) CHECK_NEAR(F32(p.value)[i], w[i], 1e-6);
    release_param(&p);
}

static void test_clip_and_checks(void) {
    CHECK_NEAR(gp_clip_factor(0.0f, 100.0), 1.0, 0);
    CHECK_NEAR(gp_clip_factor(1.0f, 0.5), 1.0, 0);
    CHECK_NEAR(gp_clip_factor(1.0f, 4.0), 1.0 / (4.0 + 1e-6), 1e-7);
    gp_optim_opts o = gp_adamw_defaults(-1.0f, 0.0f);
    CHECK_FAILS(gp_optim_check(&o), GP_CONFIG, "learning rate -1");
    o = gp_sgd_defaults(0.1f, 1.5f);
    CHECK_FAILS(gp_optim_check(&o), GP_CONFIG, "momentum 1.5");
    o = gp_adamw_defaults(0.1f, 0.0f);
    o.clip_norm = -2;
    CHECK_FAILS(gp_optim_check(&o), GP_CONFIG, "clip norm -2");
    o = gp_adamw_defaults(0.1f, 0.0f);
    o.min_lr = 0.2f;
    CHECK_FAILS(gp_optim_check(&o), GP_CONFIG, "min_lr");
    o = gp_adamw_defaults(0.1f, 0.0f);
    CHECK_OK(gp_optim_check(&o));
}

/* The planner's optimizer timing: a positive rate per element for each optimizer, with and
 * without clipping, and the arguments checked. */
static void test_profile(void) {
    gp_optim_opts opts[3] = {gp_adamw_defaults(1e-3f, 0.01f), gp_sgd_defaults(0.1f, 0.9f),
                             gp_sgd_defaults(0.1f, 0.0f)};
    opts[0].clip_norm = 1.0f;
    for (int i = 0; i < 3; i++) {
        double r = -1;
        CHECK_OK(gp_optim_profile(&opts[i], 4096, 3, &r));
        CHECK(isfinite(r) && r > 0);
    }
    double r = 0;
    CHECK_FAILS(gp_optim_profile(&opts[0], -1, 3, &r), GP_INVALID_ARGUMENT, "-1 elements");
    CHECK_FAILS(gp_optim_profile(&opts[0], (int64_t)1 << 29, 3, &r), GP_INVALID_ARGUMENT,
                "expected 0 (default 2^22) to 2^28");
    CHECK_FAILS(gp_optim_profile(&opts[0], 16, -1, &r), GP_INVALID_ARGUMENT, "-1 repetitions");
    CHECK_FAILS(gp_optim_profile(&opts[0], 16, 3, NULL), GP_INVALID_ARGUMENT, "NULL output");
    gp_optim_opts bad = gp_sgd_defaults(0.1f, 1.5f);
    CHECK_FAILS(gp_optim_profile(&bad, 16, 3, &r), GP_CONFIG, "momentum 1.5");
}

int main(void) {
    gp_device *d;
    REQUIRE_OK(gp_device_cpu_new("optim", &d));
    test_schedule();
    test_schedule_cycles();
    test_adamw(d);
    test_sgd(d);
    test_clip_and_checks();
    test_profile();
    gp_mem_stats st;
    gp_device_mem_stats(d, &st);
    CHECK_EQ_INT(st.live_total, 0);
    gp_device_free(d);
    return gp_test_finish("test_optim");
}
