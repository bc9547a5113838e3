/* Test helpers: assertions that print both operands and where, and a
 * finite-difference gradient checker for any layer. */
#ifndef GP_TESTUTIL_H
#define GP_TESTUTIL_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpipe.h"
#include "layers/layer.h"
#include "support/support.h"

extern int gp_test_failures;

/* A tensor's data as float / int32 for the tests, whose tensors live in host memory (CPU
 * devices and views). */
#define F32(t) ((float *)(t).data)
#define I32(t) ((int32_t *)(t).data)

#define CHECK(cond)                                                                    \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);   \
            gp_test_failures++;                                                        \
        }                                                                              \
    } while (0)

#define CHECK_OK(expr)                                                                 \
    do {                                                                               \
        gp_status s_ = (expr);                                                         \
        if (s_ != GP_OK) {                                                             \
            fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #expr,  \
                    gp_status_name(s_), gp_last_error());                              \
            gp_test_failures++;                                                        \
        }                                                                              \
    } while (0)

/* Must succeed or the test cannot go on. */
#define REQUIRE_OK(expr)                                                               \
    do {                                                                               \
        gp_status s_ = (expr);                                                         \
        if (s_ != GP_OK) {                                                             \
            fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #expr,  \
                    gp_status_name(s_), gp_last_error());                              \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

/* Expects a failure with status `want` whose message contains `needle`. */
#define CHECK_FAILS(expr, want, needle)                                                \
    gp_test_check_fails_((expr), (want), (needle), #expr, __FILE__, __LINE__)

#define CHECK_EQ_INT(a, b)                                                             \
    do {                                                                               \
        long long a_ = (long long)(a), b_ = (long long)(b);                            \
        if (a_ != b_) {                                                                \
            fprintf(stderr, "%s:%d: %s == %s failed: %lld vs %lld\n", __FILE__, __LINE__,\
                    #a, #b, a_, b_);                                                   \
            gp_test_failures++;                                                        \
        }                                                                              \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                          \
    do {                                                                               \
        double a_ = (double)(a), b_ = (double)(b);                                     \
        if (!(fabs(a_ - b_) <= (tol))) {                                               \
            fprintf(stderr, "%s:%d: |%s - %s| <= %g failed: %.9g vs %.9g\n", __FILE__, \
                    __LINE__, #a, #b, (double)(tol), a_, b_);                          \
            gp_test_failures++;                                                        \
        }                                                                              \
    } while (0)

void gp_test_check_fails_(gp_status got, gp_status want, const char *needle, const char *expr,
                          const char *file, int line);

/* The tools' --partition parser (support.h) refuses text with a reason containing needle. */
#define CHECK_PARSE_FAILS(text, cap, needle) gp_test_parse_fails_((text), (cap), (needle), __FILE__, __LINE__)
void gp_test_parse_fails_(const char *text, int cap, const char *needle, const char *file, int line);

/* Prints "N passed, M failed" style summary and returns the exit code. */
int gp_test_finish(const char *name);

/* A scratch folder for one test program (mkdtemp under /tmp; exits if it
 * cannot be made). Paths remembered are removed, newest first, by
 * gp_scratch_cleanup, which then removes the folder and counts a failure if
 * anything was left in it. gp_scratch_path returns one of 4 rotating buffers. */
const char *gp_scratch_init(const char *test_name);
const char *gp_scratch_dir(void);
const char *gp_scratch_path(const char *name);
void gp_scratch_remember(const char *path);
void gp_scratch_cleanup(void);

/* The whole file as a NUL-terminated string (malloc'ed; the caller frees it), or NULL when it
 * cannot be opened or read completely. */
char *gp_test_read_file(const char *path);

/* Fills with values drawn from (seed, stream): uniform in +-[lo, hi] with
 * random sign, so never zero when lo > 0. */
void gp_test_fill(float *x, int64_t n, uint64_t seed, uint32_t stream, float lo, float hi);

/* Central finite-difference check of a layer: f = sum(y * r) for a random r.
 * Checks dx (unless the input is int32) and every trainable parameter's
 * gradient on up to `samples` coordinates each. The layer's parameters are
 * allocated and randomized here. Returns the number of mismatches. */
typedef struct gp_gradcheck_opts {
    double eps;     /* step, default 1e-2 */
    double rtol;    /* default 1e-2 */
    double atol;    /* default 1e-3 */
    int samples;    /* per tensor, default 48 */
    bool training;  /* default true via gp_gradcheck_defaults */
    int vocab;      /* for int32 inputs: values in [0, vocab) */
    float param_lo, param_hi; /* parameter magnitudes, default 0.1..1 */
} gp_gradcheck_opts;
gp_gradcheck_opts gp_gradcheck_defaults(void);
int gp_gradcheck(gp_layer *l, gp_shape in, gp_dtype dtype, uint64_t seed,
                 const gp_gradcheck_opts *o);

/* Single-device training as the library does it: a one-stage pipeline on the device m is
 * initialized on, M micro-batches (0 means 1), each micro-batch's forward then its backward
 * (1F1B, nothing recomputed), dropout keyed by the model's init seed. Exits if it cannot be
 * made. */
gp_pipeline *gp_test_single(gp_model *m, const gp_optim_opts *o, int M);
/* gp_model_params_fnv1a64, exiting on failure; a model without values hashes to
 * GP_TEST_FNV_EMPTY (the FNV-1a offset basis). */
#define GP_TEST_FNV_EMPTY 0xcbf29ce484222325ULL
uint64_t gp_test_hash(const gp_model *m);
/* Whether a thread of this process is named `name` (/proc/self/task/<tid>/comm): now, or, with
 * wait_s > 0, within that many seconds (a thread names itself once it runs). */
bool gp_test_thread_named(const char *name, double wait_s);
/* Parameter `name` of layer li of m (host pointers on the CPU devices the tests use), with its
 * gradient; exits naming it where there is none. */
gp_param_info gp_test_param_of(gp_model *m, int li, const char *name);

/* Two small networks for the tests that train (the pipeline and checkpoint tests): the
 * Transformer (vocab 64, dim 32, 4 heads, d_ff 64, 4 blocks, seq_len 16, dropout 0.1) with AdamW
 * clipped at 0.5, and the ConvNet (channels 4 and 8, hidden 16, batch norm) with SGD momentum
 * 0.9 clipped at 1. Batches of up to GP_TEST_NET_MAX_BATCH examples keyed by a seed: (B, 16)
 * tokens and next tokens (label 5 ignored), or (B, 1, 28, 28) images and classes. */
typedef enum gp_test_net {
    GP_TEST_TRANSFORMER,
    GP_TEST_CONVNET,
    GP_TEST_TRANSFORMER_TIED /* the Transformer with its head's weight tied to the embedding */
} gp_test_net;
#define GP_TEST_NET_MAX_BATCH 8
typedef struct gp_test_batch {
    float xf[GP_TEST_NET_MAX_BATCH * 28 * 28];
    int32_t xi[GP_TEST_NET_MAX_BATCH * 16], y[GP_TEST_NET_MAX_BATCH * 16];
    gp_tensor x, y_t; /* views of the arrays */
} gp_test_batch;
gp_model *gp_test_net_build(gp_test_net net); /* exits if it cannot */
gp_optim_opts gp_test_net_optim(gp_test_net net);
void gp_test_net_batch(gp_test_net net, int64_t batch, uint64_t seed, gp_test_batch *b);

#endif
