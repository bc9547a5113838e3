/* Test helpers shared by every test program. */
#include "testutil.h"

#include <dirent.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"

int gp_test_failures = 0;

void gp_test_check_fails_(gp_status got, gp_status want, const char *needle, const char *expr,
                          const char *file, int line) {
    if (got != want) {
        fprintf(stderr, "%s:%d: %s returned %s, expected %s (message: %s)\n", file, line, expr,
                gp_status_name(got), gp_status_name(want), gp_last_error());
        gp_test_failures++;
    } else if (needle && !strstr(gp_last_error(), needle)) {
        fprintf(stderr, "%s:%d: %s: message \"%s\" does not contain \"%s\"\n", file, line, expr,
                gp_last_error(), needle);
        gp_test_failures++;
    }
}

int gp_test_finish(const char *name) {
    if (gp_test_failures) {
        fprintf(stderr, "%s: %d check(s) FAILED\n", name, gp_test_failures);
        return 1;
    }
    printf("%s: all checks passed\n", name);
    return 0;
}

void gp_test_fill(float *x, int64_t n, uint64_t seed, uint32_t stream, float lo, float hi) {
    gp_rng_stream s = {.seed = seed, .purpose = GP_RNG_TEST, .a = stream};
    float *u = malloc((size_t)n * 2 * sizeof *u);
    gp_rng_uniform(&s, 0, u, 2 * n);
    for (int64_t i = 0; i < n; i++) {
        float mag = lo + (hi - lo) * u[2 * i];
        x[i] = u[2 * i + 1] < 0.5f ? -mag : mag;
    }
    free(u);
}

gp_gradcheck_opts gp_gradcheck_defaults(void) {
    return (gp_gradcheck_opts){.eps = 1e-2, .rtol = 1e-2, .atol = 1e-3, .samples = 48,
                               .training = true, .vocab = 16, .param_lo = 0.1f,
                               .param_hi = 1.0f};
}

/* f = sum(y * r) in double. */
static double objective(gp_layer *l, gp_device *dev, const gp_run *run, const gp_tensor *x,
                        const gp_shape *oshape, const float *r) {
    gp_tensor y;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, *oshape, GP_F32, &y));
    gp_ctx c;
    gp_ctx_init(&c, dev, run);
    c.x = x;
    c.y = &y;
    REQUIRE_OK(l->ops->forward(l, &c, x, &y));
    double f = 0;
    for (int64_t i = 0; i < gp_tensor_nelem(&y); i++) f += (double)F32(y)[i] * r[i];
    gp_ctx_release(&c);
    gp_tensor_release(&y);
    return f;
}

static int compare(const char *what, int64_t idx, double num, double ana,
                   const gp_gradcheck_opts *o, const gp_layer *l) {
    double tol = o->atol + o->rtol * fmax(fabs(num), fabs(ana));
    if (fabs(num - ana) <= tol) return 0;
    fprintf(stderr, "gradcheck %s: %s[%lld]: numeric %.6g vs analytic %.6g\n", l->ops->kind, what,
            (long long)idx, num, ana);
    return 1;
}

int gp_gradcheck(gp_layer *l, gp_shape in, gp_dtype dtype, uint64_t seed,
                 const gp_gradcheck_opts *o) {
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("gradcheck", &dev));
    l->index = 3;
    gp_shape os;
    REQUIRE_OK(l->ops->out_shape(l, &in, dtype, &os));
    /* Parameters: random non-zero values; gradients zeroed. */
    for (int i = 0; i < l->nparams; i++) {
        gp_param *p = &l->params[i];
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_PARAMS, p->shape, GP_F32, &p->value));
        if (p->trainable) {
            gp_test_fill(p->value.data, gp_tensor_nelem(&p->value), seed, 100 + (uint32_t)i,
                         o->param_lo, o->param_hi);
            REQUIRE_OK(gp_tensor_zeros(dev, GP_MEM_GRADS, p->shape, GP_F32, &p->grad));
        } else {
            float v = p->init == GP_INIT_ONES ? 1.0f : 0.0f;
            for (int64_t k = 0; k < gp_tensor_nelem(&p->value); k++) F32(p->value)[k] = v;
        }
    }
    gp_tensor x, dx = {0}, dy;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, in, dtype, &x));
    if (dtype == GP_I32) {
        int32_t *xi = (int32_t *)x.data;
        for (int64_t i = 0; i < gp_tensor_nelem(&x); i++)
            xi[i] = (int32_t)(gp_rng_u64(&(gp_rng_stream){.seed = seed, .purpose = GP_RNG_TEST,
                                                         .a = 7},
                                         (uint64_t)i) %
                              (uint64_t)o->vocab);
    } else {
        gp_test_fill(x.data, gp_tensor_nelem(&x), seed, 1, 0.1f, 1.0f);
        REQUIRE_OK(gp_tensor_zeros(dev, GP_MEM_ACTIVATIONS, in, GP_F32, &dx));
    }
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, os, GP_F32, &dy));
    gp_test_fill(dy.data, gp_tensor_nelem(&dy), seed, 2, 0.1f, 1.0f);

    gp_run run = {.training = o->training, .recompute = false, .seed = seed, .step = 5,
                  .micro_batch = 1};
    /* Analytic. */
    gp_tensor y;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, os, GP_F32, &y));
    gp_ctx c;
    gp_ctx_init(&c, dev, &run);
    c.x = &x;
    c.y = &y;
    REQUIRE_OK(l->ops->forward(l, &c, &x, &y));
    REQUIRE_OK(l->ops->backward(l, &c, &dy, dtype == GP_I32 ? NULL : &dx));
    gp_ctx_release(&c);
    gp_tensor_release(&y);

    /* Running statistics must not drift while we probe. */
    gp_run probe = run;
    probe.recompute = true;

    int bad = 0;
    gp_rng_stream pick = {.seed = seed, .purpose = GP_RNG_TEST, .a = 99};
    if (dtype == GP_F32) {
        int64_t n = gp_tensor_nelem(&x);
        for (int s = 0; s < o->samples && s < n; s++) {
            int64_t i = n <= o->samples ? s : (int64_t)(gp_rng_u64(&pick, (uint64_t)s) % (uint64_t)n);
            float keep = F32(x)[i];
            F32(x)[i] = keep + (float)o->eps;
            double fp = objective(l, dev, &probe, &x, &os, dy.data);
            F32(x)[i] = keep - (float)o->eps;
            double fm = objective(l, dev, &probe, &x, &os, dy.data);
            F32(x)[i] = keep;
            bad += compare("dx", i, (fp - fm) / (2 * o->eps), F32(dx)[i], o, l);
        }
    }
    for (int pi = 0; pi < l->nparams; pi++) {
        gp_param *p = &l->params[pi];
        if (!p->trainable) continue;
        int64_t n = gp_tensor_nelem(&p->value);
        for (int s = 0; s < o->samples && s < n; s++) {
            int64_t i = n <= o->samples
                            ? s
                            : (int64_t)(gp_rng_u64(&pick, 1000003u * (uint64_t)(pi + 1) + (uint64_t)s) %
                                        (uint64_t)n);
            float keep = F32(p->value)[i];
            F32(p->value)[i] = keep + (float)o->eps;
            double fp = objective(l, dev, &probe, &x, &os, dy.data);
            F32(p->value)[i] = keep - (float)o->eps;
            double fm = objective(l, dev, &probe, &x, &os, dy.data);
            F32(p->value)[i] = keep;
            bad += compare(p->name, i, (fp - fm) / (2 * o->eps), F32(p->grad)[i], o, l);
        }
    }
    gp_tensor_release(&x);
    gp_tensor_release(&dx);
    gp_tensor_release(&dy);
    for (int i = 0; i < l->nparams; i++) {
        gp_tensor_release(&l->params[i].value);
        gp_tensor_release(&l->params[i].grad);
    }
    gp_mem_stats st;
    gp_device_mem_stats(dev, &st);
    if (st.live_total != 0) {
        fprintf(stderr, "gradcheck %s: %llu bytes still live on the device (a leak)\n",
                l->ops->kind, (unsigned long long)st.live_total);
        bad++;
    }
    gp_device_free(dev);
    if (bad) gp_test_failures += bad;
    return bad;
}

void gp_test_parse_fails_(const char *text, int cap, const char *needle, const char *file,
                          int line) {
    int first[64], n = 0;
    char why[512] = "";
    if (cap > 64) cap = 64;
    if (gp_cli_parse_partition(text, first, cap, &n, why, sizeof why) || !strstr(why, needle)) {
        fprintf(stderr, "%s:%d: partition '%s': expected a failure containing '%s', got %s\n",
                file, line, text, needle, why[0] ? why : "success");
        gp_test_failures++;
    }
}

gp_pipeline *gp_test_single(gp_model *m, const gp_optim_opts *o, int M) {
    gp_pipeline_opts po = {.stages = 1, .micro_batches = M, .schedule = GP_SCHEDULE_1F1B,
                           .remat = GP_REMAT_NONE};
    gp_pipeline *p = NULL;
    REQUIRE_OK(gp_pipeline_new(m, o, &po, 0, &p));
    return p;
}

uint64_t gp_test_hash(const gp_model *m) {
    uint64_t h = 0;
    REQUIRE_OK(gp_model_params_fnv1a64(m, &h));
    return h;
}

static bool thread_named_now(const char *name) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return false;
    bool found = false;
    for (struct dirent *e; !found && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[300], comm[32] = {0};
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue; /* the thread ended meanwhile */
        if (fgets(comm, sizeof comm, f)) {
            comm[strcspn(comm, "\n")] = 0;
            found = strcmp(comm, name) == 0;
        }
        fclose(f);
    }
    closedir(d);
    return found;
}

bool gp_test_thread_named(const char *name, double wait_s) {
    const struct timespec nap = {0, 200000};
    const double until = gp_now() + wait_s;
    while (!thread_named_now(name)) {
        if (gp_now() >= until) return false;
        nanosleep(&nap, NULL);
    }
    return true;
}

#define SCRATCH_MAX 64
static char scratch_dir[96];
static char scratch_made[SCRATCH_MAX][192];
static int scratch_n;

const char *gp_scratch_init(const char *test_name) {
    snprintf(scratch_dir, sizeof scratch_dir, "/tmp/gp_%s_XXXXXX", test_name);
    if (!mkdtemp(scratch_dir)) {
        perror("mkdtemp");
        exit(1);
    }
    return scratch_dir;
}

const char *gp_scratch_dir(void) { return scratch_dir; }

const char *gp_scratch_path(const char *name) {
    static char buf[4][192];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", scratch_dir, name);
    return buf[k];
}

void gp_scratch_remember(const char *path) {
    for (int i = 0; i < scratch_n; i++)
        if (strcmp(scratch_made[i], path) == 0) return;
    if (scratch_n < SCRATCH_MAX) snprintf(scratch_made[scratch_n++], sizeof scratch_made[0], "%s", path);
}

void gp_scratch_cleanup(void) {
    for (int i = scratch_n - 1; i >= 0; i--) remove(scratch_made[i]);
    scratch_n = 0;
    if (rmdir(scratch_dir) != 0) {
        fprintf(stderr, "could not remove %s (something was left in it)\n", scratch_dir);
        gp_test_failures++;
    }
}

gp_model *gp_test_net_build(gp_test_net net) {
    gp_model *m = NULL;
    if (net != GP_TEST_CONVNET) {
        gp_transformer_config c = {.vocab = 64, .dim = 32, .heads = 4, .d_ff = 64, .layers = 4,
                                   .seq_len = 16, .dropout = 0.1f,
                                   .tie_embeddings = net == GP_TEST_TRANSFORMER_TIED};
        REQUIRE_OK(gp_model_transformer(&c, &m));
    } else {
        gp_convnet_config c = gp_convnet_defaults();
        c.ch1 = 4;
        c.ch2 = 8;
        c.hidden = 16;
        REQUIRE_OK(gp_model_convnet(&c, &m));
    }
    return m;
}

gp_optim_opts gp_test_net_optim(gp_test_net net) {
    gp_optim_opts o;
    if (net != GP_TEST_CONVNET) {
        o = gp_adamw_defaults(3e-3f, 0.01f);
        o.clip_norm = 0.5f; /* small enough to clip: exercises the all-reduced norm */
    } else {
        o = gp_sgd_defaults(0.05f, 0.9f);
        o.clip_norm = 1.0f;
    }
    return o;
}

void gp_test_net_batch(gp_test_net net, int64_t batch, uint64_t seed, gp_test_batch *b) {
    if (batch < 1 || batch > GP_TEST_NET_MAX_BATCH) abort();
    const int B = (int)batch;
    if (net != GP_TEST_CONVNET) {
        float r[GP_TEST_NET_MAX_BATCH * 17];
        gp_rng_stream st = {.seed = seed, .purpose = GP_RNG_TEST};
        gp_rng_uniform(&st, 0, r, B * 17);
        for (int i = 0; i < B; i++)
            for (int t = 0; t < 16; t++) {
                b->xi[i * 16 + t] = (int32_t)(r[i * 17 + t] * 64) % 64;
                b->y[i * 16 + t] = (int32_t)(r[i * 17 + t + 1] * 64) % 64;
            }
        b->y[5] = -1; /* an ignored label: the normalizer counts the whole mini-batch's labels */
        b->x = gp_tensor_view(b->xi, gp_shape2(B, 16), GP_I32);
        b->y_t = gp_tensor_view(b->y, gp_shape2(B, 16), GP_I32);
    } else {
        gp_test_fill(b->xf, (int64_t)B * 28 * 28, seed, 1, 0.0f, 1.5f);
        for (int i = 0; i < B; i++) b->y[i] = (int32_t)((seed * 7 + (uint64_t)i * 3) % 10);
        b->x = gp_tensor_view(b->xf, gp_shape4(B, 1, 28, 28), GP_F32);
        b->y_t = gp_tensor_view(b->y, gp_shape1(B), GP_I32);
    }
}

char *gp_test_read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

gp_param_info gp_test_param_of(gp_model *m, int li, const char *name) {
    for (int i = 0; i < gp_model_nparam_tensors(m); i++) {
        gp_param_info pi;
        REQUIRE_OK(gp_model_param(m, i, &pi));
        if (pi.layer == li && strcmp(pi.name, name) == 0) return pi;
    }
    fprintf(stderr, "no parameter %s in layer %d\n", name, li);
    exit(1);
}
