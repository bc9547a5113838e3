/* cuBLASLt's products with a bias epilogue (gemm_lt.h): descriptors made for each product run
 * (host work only), the heuristic's algorithm kept per shape, so that asking whether a known
 * shape is supported makes none. */
#include "kernels/cuda/gemm_lt.h"

#include <cublasLt.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* Shapes a device keeps an answer for: a Transformer stage has a few per layer kind (forward and
 * remat share them); past this the heuristic is asked on every call, which is correct, only
 * slower. */
#define LT_CACHE 64

/* All int64_t: compared with memcmp, so no padding may differ. Every pointer is 16-byte aligned
 * (gp_cuda_lt_supports), so the shape is the whole key. */
typedef struct lt_key {
    int64_t trans_a, trans_b, m, n, k, lda, ldb, ldd, bias, beta;
} lt_key;

typedef struct lt_entry {
    lt_key key;
    bool found;
    cublasLtMatmulAlgo_t algo;
} lt_entry;

struct gp_cuda_lt {
    cublasLtHandle_t handle;
    pthread_mutex_t lock;
    int n;
    lt_entry cache[LT_CACHE];
};

typedef struct lt_descs {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d; /* C has D's layout */
} lt_descs;

gp_cuda_lt *gp_cuda_lt_new(const gp_cuda_ctx *c, gp_status *status) {
    gp_cuda_lt *lt = calloc(1, sizeof *lt);
    if (!lt) {
        *status = gp_error(GP_OUT_OF_MEMORY, "device %s: cannot allocate its cuBLASLt state",
                           c->name);
        return NULL;
    }
    *status = gp_cuda_blas_status(c, cublasLtCreate(&lt->handle), "cublasLtCreate");
    if (*status == GP_OK && pthread_mutex_init(&lt->lock, NULL) != 0) {
        (void)cublasLtDestroy(lt->handle);
        *status = gp_error(GP_INTERNAL, "device %s: cannot make its cuBLASLt lock", c->name);
    }
    if (*status != GP_OK) {
        free(lt);
        return NULL;
    }
    return lt;
}

void gp_cuda_lt_free(gp_cuda_lt *lt) {
    if (!lt) return;
    (void)cublasLtDestroy(lt->handle);
    pthread_mutex_destroy(&lt->lock);
    free(lt);
}

/* Where cuBLASLt is used at all: the alignment its tensor-core kernels want of every matrix and
 * of the bias. Elsewhere the prefill path, so the algorithm (and with it the bits) never
 * depends on where a buffer happens to lie. */
#define LT_ALIGN 16

static bool aligned(const void *p) { return (uintptr_t)p % LT_ALIGN == 0; }

static lt_key key_of(const gp_cuda_lt_gemm *g) {
    lt_key k;
    memset(&k, 0, sizeof k);
    k.trans_a = g->trans_a;
    k.trans_b = g->trans_b;
    k.m = g->m, k.n = g->n, k.k = g->k;
    k.lda = g->lda, k.ldb = g->ldb, k.ldd = g->ldd;
    k.bias = g->bias != NULL;
    k.beta = g->beta != 0.0f;
    return k;
}

static void descs_free(lt_descs *s) {
    if (s->op) (void)cublasLtMatmulDescDestroy(s->op);
    if (s->a) (void)cublasLtMatrixLayoutDestroy(s->a);
    if (s->b) (void)cublasLtMatrixLayoutDestroy(s->b);
    if (s->d) (void)cublasLtMatrixLayoutDestroy(s->d);
}

/* The call's descriptors: bf16 A and B, fp32 C and D, fp32 sums and scale, the bias epilogue
 * with an fp32 bias where there is one. */
static cublasStatus_t descs_make(const gp_cuda_lt_gemm *g, lt_descs *s) {
    memset(s, 0, sizeof *s);
    /* the attributes' own types (cublasLt.h), not the enums' */
    const int32_t ta = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int32_t tb = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const uint32_t epi = g->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    const int32_t bias_type = CUDA_R_32F;
    cublasStatus_t e = cublasLtMatmulDescCreate(&s->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (e == CUBLAS_STATUS_SUCCESS)
        e = cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (e == CUBLAS_STATUS_SUCCESS)
        e = cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (e == CUBLAS_STATUS_SUCCESS)
        e = cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (e == CUBLAS_STATUS_SUCCESS && g->bias)
        e = cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                           sizeof g->bias);
    if (e == CUBLAS_STATUS_SUCCESS && g->bias)
        e = cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                           sizeof bias_type);
    /* stored as they are read: op(A) is m x k, so A itself is k x m when transposed */
    if (e == CUBLAS_STATUS_SUCCESS)
        e = cublasLtMatrixLayoutCreate(&s->a, CUDA_R_16BF, (uint64_t)(g->trans_a ? g->k : g->m),
                                       (uint64_t)(g->trans_a ? g->m : g->k), g->lda);
    if (e == CUBLAS_STATUS_SUCCESS)
        e = cublasLtMatrixLayoutCreate(&s->b, CUDA_R_16BF, (uint64_t)(g->trans_b ? g->n : g->k),
                                       (uint64_t)(g->trans_b ? g->k : g->n), g->ldb);
    if (e == CUBLAS_STATUS_SUCCESS)
        e = cublasLtMatrixLayoutCreate(&s->d, CUDA_R_32F, (uint64_t)g->m, (uint64_t)g->n, g->ldd);
    if (e != CUBLAS_STATUS_SUCCESS) descs_free(s);
    return e;
}

/* The heuristic's first algorithm for g: no workspace, no reduction scheme, 16-byte aligned
 * pointers. *found false where there is none, or where the heuristic refuses the question (a
 * combination this cuBLASLt does not take): the prefill path then. Only a failed allocation is
 * an error. */
static cublasStatus_t ask(cublasLtHandle_t h, const lt_descs *s, bool *found,
                          cublasLtMatmulAlgo_t *algo) {
    *found = false;
    cublasLtMatmulPreference_t pref = NULL;
    const uint64_t no_workspace = 0;
    const uint32_t no_reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    cublasStatus_t e = cublasLtMatmulPreferenceCreate(&pref);
    if (e == CUBLAS_STATUS_SUCCESS)
        e = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &no_workspace, sizeof no_workspace);
    if (e == CUBLAS_STATUS_SUCCESS)
        e = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                 &no_reduction, sizeof no_reduction);
    for (int i = 0; i < 4 && e == CUBLAS_STATUS_SUCCESS; i++) {
        const uint32_t a = LT_ALIGN;
        e = cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &a, sizeof a);
    }
    cublasLtMatmulHeuristicResult_t r;
    int n = 0;
    if (e == CUBLAS_STATUS_SUCCESS)
        e = cublasLtMatmulAlgoGetHeuristic(h, s->op, s->a, s->b, s->d, s->d, pref, 1, &r, &n);
    if (pref) (void)cublasLtMatmulPreferenceDestroy(pref);
    if (e == CUBLAS_STATUS_ALLOC_FAILED) return e;
    if (e == CUBLAS_STATUS_SUCCESS && n > 0 && r.state == CUBLAS_STATUS_SUCCESS) {
        *found = true;
        *algo = r.algo;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* The kept answer for g, asking the heuristic the first time (with descriptors made for the
 * question: a kept answer needs none). */
static gp_status lookup(gp_cuda_ctx *c, const gp_cuda_lt_gemm *g, bool *found,
                        cublasLtMatmulAlgo_t *algo) {
    gp_cuda_lt *lt = c->lt;
    const lt_key key = key_of(g);
    pthread_mutex_lock(&lt->lock);
    for (int i = 0; i < lt->n; i++)
        if (memcmp(&lt->cache[i].key, &key, sizeof key) == 0) {
            *found = lt->cache[i].found;
            *algo = lt->cache[i].algo;
            pthread_mutex_unlock(&lt->lock);
            return GP_OK;
        }
    lt_descs s;
    cublasStatus_t e = descs_make(g, &s);
    const char *call = "cuBLASLt's descriptors";
    if (e == CUBLAS_STATUS_SUCCESS) {
        e = ask(lt->handle, &s, found, algo);
        call = "cublasLtMatmulAlgoGetHeuristic";
        descs_free(&s);
    }
    if (e == CUBLAS_STATUS_SUCCESS && lt->n < LT_CACHE)
        lt->cache[lt->n++] = (lt_entry){.key = key, .found = *found, .algo = *algo};
    pthread_mutex_unlock(&lt->lock);
    return gp_cuda_blas_status(c, e, call);
}

static gp_status checked_dims(const gp_cuda_ctx *c, const gp_cuda_lt_gemm *g) {
    if (!c->lt)
        return gp_error(GP_UNSUPPORTED, "device %s: no cuBLASLt (GP_CUDA_EPILOGUE=prefill)",
                        c->name);
    const int64_t dims[] = {g->m, g->n, g->k, g->lda, g->ldb, g->ldd};
    const char *const names[] = {"m", "n", "k", "lda", "ldb", "ldd"};
    for (int i = 0; i < 6; i++) GP_TRY(gp_kernels_check_int(c, "cuBLASLt gemm", dims[i], names[i]));
    if (g->m <= 0 || g->n <= 0 || g->k <= 0 || (g->beta != 0.0f && !g->c))
        return gp_error(GP_INVALID_ARGUMENT,
                        "device %s: cuBLASLt gemm of %lld x %lld x %lld%s: expected sizes above 0 "
                        "and C with a beta not 0",
                        c->name, (long long)g->m, (long long)g->n, (long long)g->k,
                        g->c ? "" : " without C");
    return GP_OK;
}

/* A shape whose algorithm cublasLtMatmul refused after all: the prefill path from now on. */
static void forget(gp_cuda_lt *lt, const gp_cuda_lt_gemm *g) {
    const lt_key key = key_of(g);
    pthread_mutex_lock(&lt->lock);
    for (int i = 0; i < lt->n; i++)
        if (memcmp(&lt->cache[i].key, &key, sizeof key) == 0) lt->cache[i].found = false;
    pthread_mutex_unlock(&lt->lock);
}

gp_status gp_cuda_lt_supports(gp_cuda_ctx *c, const gp_cuda_lt_gemm *g, bool *yes) {
    *yes = false;
    GP_TRY(checked_dims(c, g));
    if (!aligned(g->a16) || !aligned(g->b16) || !aligned(g->d) ||
        (g->beta != 0.0f && !aligned(g->c)) || (g->bias && !aligned(g->bias)))
        return GP_OK;
    cublasLtMatmulAlgo_t algo;
    return lookup(c, g, yes, &algo);
}

gp_status gp_cuda_lt_run(gp_cuda_ctx *c, const gp_cuda_lt_gemm *g, bool *done) {
    *done = false;
    GP_TRY(checked_dims(c, g));
    lt_descs s;
    GP_TRY(gp_cuda_blas_status(c, descs_make(g, &s), "cuBLASLt's descriptors"));
    bool found = false;
    cublasLtMatmulAlgo_t algo;
    gp_status st = lookup(c, g, &found, &algo);
    if (st == GP_OK && !found)
        st = gp_error(GP_UNSUPPORTED,
                      "device %s: cuBLASLt has no algorithm for a %lld x %lld x %lld bf16 "
                      "product%s",
                      c->name, (long long)g->m, (long long)g->n, (long long)g->k,
                      g->bias ? " with a bias" : "");
    const float alpha = 1.0f;
    if (st == GP_OK) {
        const cublasStatus_t e =
            cublasLtMatmul(c->lt->handle, s.op, &alpha, g->a16, s.a, g->b16, s.b, &g->beta,
                           g->beta != 0.0f ? g->c : g->d, s.d, g->d, s.d, &algo, NULL, 0,
                           c->stream);
        if (e == CUBLAS_STATUS_NOT_SUPPORTED)
            forget(c->lt, g); /* nothing queued: the caller takes the prefill path */
        else
            st = gp_cuda_blas_check(c, e, "cublasLtMatmul");
        *done = st == GP_OK && e == CUBLAS_STATUS_SUCCESS;
    }
    descs_free(&s);
    return st;
}
