/* gpipe: train a network written as a sequence of layers, on one device or as a GPipe pipeline
 * across several (threads, MPI processes). This is the one public header.
 *
 * A minimal program: a tiny byte-level language model trained for a few
 * steps. The build extracts the lines between the BEGIN and END markers into
 * a test program, so this example cannot drift from the API.
 *
 * EXAMPLE-BEGIN
 *   gp_model *m;
 *   gp_model_new(gp_shape1(16), GP_I32, &m);            // one example: 16 tokens
 *   gp_model_add(m, gp_embedding(256, 32));
 *   gp_model_add(m, gp_pos_embedding(16, 32));
 *   gp_model_add(m, gp_transformer_block(32, 4, 64, 0.0f));
 *   gp_model_add(m, gp_layernorm(32));
 *   gp_model_add(m, gp_linear(32, 256, false));
 *   gp_device *dev;
 *   gp_device_cpu_new("cpu0", &dev);
 *   gp_model_init(m, dev, 1234);                         // keyed by (seed, layer, param)
 *   gp_optim_opts oo = gp_adamw_defaults(1e-2f, 0.01f);
 *   gp_pipeline_opts po = {.micro_batches = 2};           // one stage: trains on dev
 *   gp_pipeline *t;
 *   if (gp_pipeline_new(m, &oo, &po, 0, &t) != GP_OK) {
 *       fprintf(stderr, "%s\n", gp_last_error());
 *       return 1;
 *   }
 *   int32_t xs[4 * 16], ys[4 * 16];                      // (B, T) inputs, next-byte labels
 *   for (int i = 0; i < 4 * 16; i++) xs[i] = "hello, pipeline!"[i % 16], ys[i] = xs[i] + 1;
 *   gp_tensor x = gp_tensor_view(xs, gp_shape2(4, 16), GP_I32);
 *   gp_tensor y = gp_tensor_view(ys, gp_shape2(4, 16), GP_I32);
 *   float first = 0, loss = 0;
 *   for (int step = 0; step < 20; step++) {
 *       if (gp_pipeline_step(t, &x, &y, &loss) != GP_OK) {
 *           fprintf(stderr, "%s\n", gp_last_error());
 *           return 1;
 *       }
 *       if (step == 0) first = loss;
 *   }
 *   printf("loss %.3f -> %.3f\n", first, loss);
 *   gp_pipeline_free(t);
 *   gp_model_free(m);
 *   gp_device_free(dev);
 *   if (!(loss < first)) return 1;                       // it learned
 * EXAMPLE-END
 *
 * Conventions:
 * - Every function that can fail returns gp_status; on failure gp_last_error()
 *   (per thread) says what went wrong, where, and what was expected.
 * - Constructors of layers return NULL on bad arguments, with the message set;
 *   gp_model_add(m, NULL) then fails with that message, so calls can be chained.
 * - "new"/"free" pairs: the caller owns what a *_new returns and frees it with
 *   the matching *_free. Functions taking a pointer to an output never keep it.
 */
#ifndef GPIPE_H
#define GPIPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GP_VERSION_MAJOR 0
#define GP_VERSION_MINOR 1
#define GP_VERSION_PATCH 0
const char *gp_version(void);

/* ---------------------------------------------------------------- status */

#define GP_STATUS_MAP(X)                                                   \
    X(OK, "success")                                                       \
    X(INVALID_ARGUMENT, "invalid argument")                                \
    X(OUT_OF_MEMORY, "out of host memory")                                 \
    X(MEMORY_LIMIT, "device memory limit exceeded")                        \
    X(IO, "input/output error")                                            \
    X(FORMAT, "malformed input data")                                      \
    X(SHAPE, "shape mismatch")                                             \
    X(CONFIG, "bad configuration")                                         \
    X(UNSUPPORTED, "not supported")                                        \
    X(NUMERIC, "numerical failure")                                        \
    X(INTERNAL, "internal error")

typedef enum gp_status {
#define GP_STATUS_ENUM_(name, msg) GP_##name,
    GP_STATUS_MAP(GP_STATUS_ENUM_)
#undef GP_STATUS_ENUM_
    GP_STATUS_COUNT
} gp_status;

const char *gp_status_name(gp_status s);    /* "GP_SHAPE" */
const char *gp_status_message(gp_status s); /* "shape mismatch" */
/* The message of the last failure on this thread; "" if none. Valid until the
 * next failing call on the same thread. */
const char *gp_last_error(void);
void gp_clear_error(void);

/* --------------------------------------------------------- shapes, dtypes */

#define GP_MAX_DIMS 4
typedef struct gp_shape {
    int ndim;
    int64_t dim[GP_MAX_DIMS];
} gp_shape;

gp_shape gp_shape1(int64_t a);
gp_shape gp_shape2(int64_t a, int64_t b);
gp_shape gp_shape3(int64_t a, int64_t b, int64_t c);
gp_shape gp_shape4(int64_t a, int64_t b, int64_t c, int64_t d);
int64_t gp_shape_nelem(const gp_shape *s);
bool gp_shape_equal(const gp_shape *a, const gp_shape *b);
/* Writes "(2, 3, 4)" into buf; returns buf. */
char *gp_shape_str(const gp_shape *s, char *buf, size_t nbytes);

/* GP_BF16: bfloat16 (the top 16 bits of a float32), 2 bytes an element: what a bf16 device
 * (gp_precision) keeps of activations that are only ever operands of its products. */
typedef enum gp_dtype { GP_F32 = 0, GP_I32 = 1, GP_BF16 = 2 } gp_dtype;
size_t gp_dtype_nbytes(gp_dtype t);
const char *gp_dtype_name(gp_dtype t);

/* --------------------------------------------------- devices and memory */

/* Every byte a device holds is counted in one of these categories. */
#define GP_MEM_CATEGORY_MAP(X)                                             \
    X(PARAMS, "parameters")                                                \
    X(GRADS, "gradients")                                                  \
    X(OPTIM, "optimizer_state")                                            \
    X(ACTIVATIONS, "activations")                                          \
    X(WORKSPACE, "workspace")

typedef enum gp_mem_category {
#define GP_MEM_ENUM_(name, str) GP_MEM_##name,
    GP_MEM_CATEGORY_MAP(GP_MEM_ENUM_)
#undef GP_MEM_ENUM_
    GP_MEM_NCATEGORIES
} gp_mem_category;
const char *gp_mem_category_name(gp_mem_category c); /* "activations" */

typedef struct gp_device gp_device;

typedef struct gp_mem_stats {
    uint64_t live[GP_MEM_NCATEGORIES]; /* bytes held now */
    uint64_t peak[GP_MEM_NCATEGORIES]; /* most bytes held at once, per category */
    uint64_t live_total;
    uint64_t peak_total; /* most bytes held at once, all categories together */
    uint64_t limit;      /* 0: none */
    uint64_t nallocs;    /* allocations made so far */
    uint64_t cached;     /* freed blocks kept for reuse (not live; held from the OS) */
    uint64_t cache_hits; /* allocations served from the cache */
} gp_mem_stats;

/* A device is where tensors live and kernels run: the CPU (host memory; kernels through CBLAS
 * and vectorized C) or a CUDA GPU. Every device counts its bytes by category and may be
 * given a limit. The caller frees a device with gp_device_free after everything allocated on
 * it has been released. A device is used by one thread at a time.
 *
 * A CPU device runs its kernels on its own threads (threads - 1 workers beside the calling
 * thread; 1 to 1024): every kernel splits its work over them, GEMMs included, each part one
 * single-threaded BLAS call, so the process runs OpenBLAS on one thread (set when the first CPU
 * device is made). The splits are over outputs (rows or columns of a GEMM's C, rows, channels,
 * examples, columns of a gradient sum), never over a sum, so the same thread count gives the
 * same bits run after run. Across thread counts everything but the GEMMs of linear layers
 * agrees bit for bit too; those may differ in the last bit of some elements (OpenBLAS rounds an
 * element by where its call's block starts). Idle workers spin for a few tens of microseconds,
 * then sleep. gp_device_cpu_new is gp_device_cpu_new_threads with 1 thread. */
gp_status gp_device_cpu_new(const char *name, gp_device **out);
gp_status gp_device_cpu_new_threads(const char *name, int threads, gp_device **out);
/* CUDA GPUs, in a build with CUDA (CMake's GP_CUDA: AUTO, the default, builds it wherever nvcc
 * is found; ON requires it; OFF leaves it out). The CUDA device is a module of its own,
 * libgpipe_cuda.so, linked with the CUDA runtime and cuBLAS, which the library loads (dlopen)
 * the first time a GPU is asked for (these three calls, or the CUDA kind through the
 * gp_device_type_* calls below): a program that never asks maps neither the module nor the
 * CUDA libraries, whatever the build. The module is installed in LIBDIR/gpipe/ and found from
 * the folder DIR of the library's own file (libgpipe.so, or the program linked with
 * libgpipe.a): DIR/gpipe/; for a program in BINDIR, LIBDIR/gpipe/ relative to it
 * (DIR/../lib/gpipe/ by default); DIR/ (the build tree); then the configured LIBDIR/gpipe/.
 * The environment variable GP_CUDA_MODULE, where set, names the one file to load instead (in
 * any build). A module that is missing, that does not load (the message quotes dlerror(): a
 * CUDA library it needs is missing, say), that is no gpipe module or that was built with
 * another version of the library is GP_UNSUPPORTED from the call, naming the files tried;
 * nothing fails before a GPU is asked for.
 *
 * A CUDA device holds its tensors in the memory of GPU `ordinal` (cudaMalloc:
 * gp_device_is_host is false, so bytes move with gp_tensor_copy and the gp_tensor_to_host /
 * from_host pair), counts them by category and honours a limit as every device does, and runs
 * its kernels in order on one stream of its own: cuBLAS for the GEMMs, in fp32 with TF32 off,
 * and gpipe's own kernels for the rest. Its results are the same bits run after run on one GPU
 * (no reduction's order depends on scheduling: no float atomics); they agree with the CPU's
 * within 1e-5 relative, and bit for bit in what only selects or copies (dropout masks,
 * embedding rows, pooling maxima and their indices). Ops that validate token ids or labels
 * copy them to the host first and wait for them, as the CPU's messages need. Not yet run on a
 * GPU: the CUDA code is compiled and checked by the build, and the GPU tests
 * (test_kernels_cuda) skip where there is none.
 *
 * gp_cuda_built: whether this build made the CUDA device's module (loads nothing).
 * gp_cuda_device_count: the number of GPUs visible (CUDA_VISIBLE_DEVICES applies), at least 1
 * on GP_OK; GP_UNSUPPORTED with *count 0 when built without CUDA ("gpipe was built without
 * CUDA (GP_CUDA=OFF or no nvcc)") and GP_CUDA_MODULE is not set, when the module cannot be
 * loaded (above), or when the CUDA runtime finds no GPU (the message quotes its error).
 * gp_device_cuda_new: a device on GPU ordinal (0 to count - 1), failing as
 * gp_cuda_device_count does, and with GP_INVALID_ARGUMENT for an ordinal out of range. A device
 * is used by one thread at a time, as every device; each call makes the GPU current on the
 * calling thread. With the environment variable GP_CUDA_PROFILE=1 when it is made, the device
 * times its kernels, cuBLAS calls, copies and fills with CUDA events on its stream and prints
 * their GPU time per name to stderr when it is freed (docs/guide.md). */
bool gp_cuda_built(void);
gp_status gp_cuda_device_count(int *count);
gp_status gp_device_cuda_new(const char *name, int ordinal, gp_device **out);
/* A CPU device's threads; 1 for other kinds and NULL. */
int gp_device_threads(const gp_device *dev);
void gp_device_free(gp_device *dev);
const char *gp_device_name(const gp_device *dev);
const char *gp_device_kind(const gp_device *dev); /* "cpu", "cuda"; "host" for NULL */
/* Whether host code may read and write the device's memory directly (the CPU's: yes). NULL
 * stands for plain host memory: true. */
bool gp_device_is_host(const gp_device *dev);
/* The arithmetic of a device's matrix products: the gemm and gemm_batched ops of its kernel
 * table (the linear layers' products) and the attention ops' products (q k^T, P v and their
 * backward). FP32 (the default): fp32 operands and sums. BF16: each operand element is rounded
 * to bfloat16 (8 significant bits, round to nearest even, NaN stays NaN) and the products are
 * summed in fp32 into the fp32 result, as TPUs' default matmul precision and PyTorch's bf16
 * autocast GEMMs do. Parameters, gradients, optimizer state and activations stay fp32 tensors
 * (bf16 storage is a later stage; the attention probabilities kept for the backward too), and
 * every other op (convolutions included) computes in fp32. On the CPU a BF16 GEMM equals the
 * FP32 GEMM of the rounded operands bit for bit (same threads), the rounded copies held in
 * workspace; on a GPU the rounded operands are bf16 in workspace (2 bytes an element of the
 * operands' spans, during the product) and cuBLAS multiplies them on the tensor cores. Training
 * in BF16 is bit-identical across K, schedules and remat modes as FP32 is.
 * gp_precision_name: "fp32", "bf16"; "unknown" for a value that is no precision.
 * gp_precision_parse: the precision of that name, or GP_INVALID_ARGUMENT naming the choices
 * (*p untouched). gp_device_set_precision: GP_INVALID_ARGUMENT for a NULL device or a value
 * that is no precision; gp_device_precision: FP32 for NULL. */
typedef enum gp_precision { GP_PRECISION_FP32 = 0, GP_PRECISION_BF16 = 1 } gp_precision;
const char *gp_precision_name(gp_precision p);
gp_status gp_precision_parse(const char *name, gp_precision *p);
gp_status gp_device_set_precision(gp_device *dev, gp_precision p);
gp_precision gp_device_precision(const gp_device *dev);
/* Waits until the device has finished the work queued on it (nothing to wait for on the CPU). */
gp_status gp_device_sync(gp_device *dev);
/* The device's GEMM rate in GFLOP/s, in its precision (fp32 unless gp_device_set_precision set
 * bf16, whose operand conversions it then includes): reps products of two random n x n matrices
 * through its kernel table (OpenBLAS on the CPU, cuBLAS on a GPU), after one untimed product,
 * between two gp_device_sync calls; the ceiling that a benchmark's achieved rate is divided by.
 * Needs 3 n^2 floats on the device (GP_MEMORY_LIMIT past its limit). */
gp_status gp_device_gemm_rate(gp_device *dev, int64_t n, int reps, double *gflops);
/* Limit on live bytes over all categories; 0 removes it. Allocations that
 * would exceed it fail with GP_MEMORY_LIMIT. */
gp_status gp_device_set_limit(gp_device *dev, uint64_t nbytes);
void gp_device_mem_stats(const gp_device *dev, gp_mem_stats *out);
/* Forget the peaks (set them to the live values), e.g. after warm-up. */
void gp_device_reset_peaks(gp_device *dev);
/* Freed blocks are kept, by exact size, for the next allocation of that size
 * (training repeats the same sizes every step, and fresh pages from the OS
 * cost page faults). They count as `cached`, never as live; a limit counts
 * live bytes only, and the cache is dropped whenever live + cached would pass
 * the limit. gp_device_trim returns the cache to the OS. */
void gp_device_trim(gp_device *dev);

/* ---------------------------------------------------------------- tensors */

/* A dense row-major tensor: `data` is untyped (its dtype says what it holds) and lives on
 * `dev`, or in host memory when dev is NULL (a view of the caller's memory). Host code reads
 * the bytes directly only where gp_tensor_host_data gives a pointer; otherwise it copies them
 * with gp_tensor_to_host / gp_tensor_from_host / gp_tensor_copy. A tensor from gp_tensor_alloc
 * owns its memory and is released with gp_tensor_release; a view (owned = false) does not. */
typedef struct gp_tensor {
    void *data;
    gp_shape shape;
    gp_dtype dtype;
    gp_device *dev;
    gp_mem_category cat;
    bool owned;
} gp_tensor;

/* Allocates uninitialized memory, 64-byte aligned, counted on dev. */
gp_status gp_tensor_alloc(gp_device *dev, gp_mem_category cat, gp_shape shape, gp_dtype dtype,
                          gp_tensor *out);
/* As gp_tensor_alloc, then fills with zeros. */
gp_status gp_tensor_zeros(gp_device *dev, gp_mem_category cat, gp_shape shape, gp_dtype dtype,
                          gp_tensor *out);
/* Frees an owned tensor and zeroes the struct; views and zeroed structs are
 * left alone, so it is safe to call twice. */
void gp_tensor_release(gp_tensor *t);
/* A non-owning view of caller host memory (dev NULL, no accounting). */
gp_tensor gp_tensor_view(void *data, gp_shape shape, gp_dtype dtype);
/* Rows [first, first + n) along the first dimension, as a view on the same device. */
gp_tensor gp_tensor_rows(const gp_tensor *t, int64_t first, int64_t n);
int64_t gp_tensor_nelem(const gp_tensor *t);
size_t gp_tensor_nbytes(const gp_tensor *t);
/* The data as a host pointer when host code may touch it (a host view, or a device whose memory
 * is host memory), else NULL. */
void *gp_tensor_host_data(const gp_tensor *t);
/* Copies src into dst: the same dtype and number of elements (shapes may differ), between any
 * two devices or host views. */
gp_status gp_tensor_copy(gp_tensor *dst, const gp_tensor *src);
/* Whole-tensor copies to and from host memory of exactly gp_tensor_nbytes(t) bytes. */
gp_status gp_tensor_to_host(const gp_tensor *t, void *dst, size_t nbytes);
gp_status gp_tensor_from_host(gp_tensor *t, const void *src, size_t nbytes);
gp_status gp_tensor_fill_zero(gp_tensor *t);

/* ---------------------------------------------------------------- random */

/* Counter-based random numbers (Philox4x32-10): the value at position i of a
 * stream depends only on (seed, stream ids, i), never on call order. */
typedef struct gp_rng_stream {
    uint64_t seed;
    uint32_t purpose; /* GP_RNG_* below */
    uint32_t a, b, c; /* e.g. layer, parameter / step, micro-batch */
} gp_rng_stream;
enum {
    GP_RNG_INIT = 1,    /* a = layer index, b = parameter index */
    GP_RNG_DROPOUT = 2, /* a = layer index * 16 + site, b = step, c = micro-batch */
    GP_RNG_DATA = 3,    /* a = epoch (shuffling), b = split */
    GP_RNG_SAMPLE = 4,  /* a = position (text generation) */
    GP_RNG_TEST = 5,    /* test fixtures */
    GP_RNG_PROFILE = 6, /* stand-in inputs of a profiling pass: a = layer index */
    GP_RNG_AUGMENT = 7  /* data augmentation of training images: a = step */
};
/* Four 32-bit words of block `block` of the stream. */
void gp_rng_block(const gp_rng_stream *s, uint64_t block, uint32_t out[4]);
/* out[i] = element first + i of the stream, uniform in [0, 1) (24-bit). */
void gp_rng_uniform(const gp_rng_stream *s, uint64_t first, float *out, int64_t n);
/* Standard normal values (Box-Muller on pairs). */
void gp_rng_normal(const gp_rng_stream *s, uint64_t first, float *out, int64_t n);
/* A uniform 64-bit value, element i of the stream. */
uint64_t gp_rng_u64(const gp_rng_stream *s, uint64_t i);

/* ---------------------------------------------------------------- layers */

typedef struct gp_layer gp_layer;

/* Per-layer cost estimate: GPipe's c_i, which the partitioner balances.
 * For a given full input shape (batch first). */
typedef struct gp_cost {
    double fwd_flops;
    double bwd_flops;
    double wgt_flops;      /* of bwd_flops, the weight gradients' (a split backward's later part) */
    uint64_t wgt_keep_bytes; /* gradients a split backward copies for its weight part, beside its
                              * input, saved state and output gradient */
    uint64_t param_bytes;  /* parameters and buffers */
    uint64_t out_bytes;    /* the output activation */
    uint64_t saved_bytes;  /* saved for backward beyond its input and output */
    /* A tensor-parallel shard's bytes given to its group's collectives (the all-reduces of its
     * layout) in one forward and one backward; 0 for a whole layer. */
    uint64_t tp_fwd_bytes, tp_bwd_bytes;
} gp_cost;

/* Constructors: the returned layer is owned by the caller until handed to
 * gp_model_add (which takes it, also on failure). NULL on bad arguments. */
gp_layer *gp_linear(int in_features, int out_features, bool bias);
/* A vocabulary head whose weight has rows >= out_features rows (a table padded for speed, tied
 * to a padded embedding): only the first out_features compute outputs, so the padding rows never
 * reach the loss or sampling, and their gradient is zero. rows = out_features is gp_linear. */
gp_layer *gp_linear_padded(int in_features, int out_features, bool bias, int rows);
gp_layer *gp_embedding(int vocab, int dim);      /* (B, T) int32 -> (B, T, dim) */
gp_layer *gp_pos_embedding(int max_len, int dim); /* (B, T, dim) -> same, adds learned rows 0..T-1 */
gp_layer *gp_layernorm(int dim);                 /* over the last dimension, eps 1e-5 */
gp_layer *gp_gelu(void);                         /* tanh form */
gp_layer *gp_relu(void);
gp_layer *gp_dropout(float p);
gp_layer *gp_causal_attention(int dim, int heads, float dropout); /* qkv + softmax(QK^T) V + proj */
/* Pre-LN block: x + attn(ln1(x)), then x + mlp(ln2(x)), mlp = fc, GELU, proj. */
gp_layer *gp_transformer_block(int dim, int heads, int d_ff, float dropout);
gp_layer *gp_conv2d(int in_ch, int out_ch, int kernel, int stride, int pad, bool bias); /* NCHW */
gp_layer *gp_batchnorm2d(int channels); /* momentum 0.1, eps 1e-5, as PyTorch */
/* ResNet's basic block: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), conv1 3x3 with the
 * stride, conv2 3x3 (no biases); shortcut x, or bn(conv 1x1, stride)(x) when the stride is not 1
 * or the channels change. Parameters conv1.weight, bn1.{weight,bias,running_mean,running_var},
 * conv2.weight, bn2.*, shortcut.conv.weight, shortcut.bn.* (torchvision's BasicBlock). */
gp_layer *gp_residual_block(int in_ch, int out_ch, int stride);
gp_layer *gp_maxpool2d(int kernel, int stride);
gp_layer *gp_global_avgpool(void); /* (B, C, H, W) -> (B, C) */
gp_layer *gp_flatten(void);        /* (B, ...) -> (B, prod(...)) */
/* Skip connections: a merge layer joins its input with the output of layer `layer`, an earlier
 * layer of the same model (its index; gp_model_add checks it and the shapes), wherever the two
 * run (a pipeline carries the skip between stages, and its gradient back). add: input + skip,
 * the same shape. concat: along dimension 1, input's first ((B, C1, ...) and (B, C2, ...) ->
 * (B, C1 + C2, ...), every other dimension equal). */
gp_layer *gp_add_from(int layer);
gp_layer *gp_concat_from(int layer);
void gp_layer_free(gp_layer *l);
const char *gp_layer_kind(const gp_layer *l);

/* ---------------------------------------------------------------- model */

typedef struct gp_model gp_model;

/* example_shape: one example's input shape, without the batch dimension. */
gp_status gp_model_new(gp_shape example_shape, gp_dtype input_dtype, gp_model **out);
void gp_model_free(gp_model *m);
/* Appends a layer (takes ownership, also on failure). Checks that the layer
 * accepts the current output shape. */
gp_status gp_model_add(gp_model *m, gp_layer *layer);
int gp_model_nlayers(const gp_model *m);
/* The dtype of the model's input (GP_F32 for a NULL model). */
gp_dtype gp_model_input_dtype(const gp_model *m);
/* One example's input shape, without the batch dimension (ndim 0 for a NULL
 * model). */
gp_shape gp_model_example_shape(const gp_model *m);
gp_layer *gp_model_layer(gp_model *m, int i);
/* Ties the first embedding layer's table (vocab, dim) to the last linear layer's weight, which
 * must have that shape (a head of in_features = dim, out_features = vocab; PyTorch's (out, in)
 * layout, so the same matrix without a transpose): GPT-2's tied embeddings. Each layer keeps a
 * copy; every step sums both uses' gradients and gives both copies the same update, so they stay
 * equal bit for bit on any number of stages. Before gp_model_init; checkpoints store the table
 * once, under the embedding's name. */
gp_status gp_model_tie_embeddings(gp_model *m);
/* Allocates every parameter on dev, in one flat block per category, and initializes it from
 * (seed, layer index, parameter index). Initializing again replaces the values. Layers may also
 * be placed on different devices with gp_model_init_range. The parameters stay with the model
 * until gp_model_free (or a pipeline moves them, see gp_pipeline_new). */
gp_status gp_model_init(gp_model *m, gp_device *dev, uint64_t seed);
gp_status gp_model_init_range(gp_model *m, int first, int last, gp_device *dev, uint64_t seed);
/* Shape of layer i's output for a batch of `batch` examples (i = -1: input). */
gp_status gp_model_shape(const gp_model *m, int i, int64_t batch, gp_shape *out);
gp_status gp_model_cost(const gp_model *m, int i, int64_t batch, gp_cost *out);
int64_t gp_model_nparams(const gp_model *m); /* trainable elements */
/* FNV-1a 64-bit over the bytes of every parameter and buffer, layer order (layers without
 * values skipped): the fingerprint reports compare runs by. Under MPI a rank holds only its
 * stage's layers: use gp_pipeline_params_fnv1a64. */
gp_status gp_model_params_fnv1a64(const gp_model *m, uint64_t *out);
/* Writes one line per layer: index, kind, output shape, parameters. */
void gp_model_print(const gp_model *m, int64_t batch, FILE *f);

/* Enumerate parameters (trainable and buffers) in layer order. */
typedef struct gp_param_info {
    int layer;
    const char *name; /* "weight", "attn.qkv.weight", "running_mean" ... */
    gp_tensor *value;
    gp_tensor *grad;  /* NULL for buffers */
    bool trainable;
} gp_param_info;
int gp_model_nparam_tensors(const gp_model *m);
gp_status gp_model_param(gp_model *m, int i, gp_param_info *out);

/* Built-in families, each with WORKLOADS.md defaults when zero-initialized
 * (see gp_transformer_defaults / gp_convnet_defaults). */
typedef struct gp_transformer_config {
    int vocab, dim, heads, d_ff, layers, seq_len;
    float dropout;
    bool tie_embeddings; /* the head's weight is the embedding's table (gp_model_tie_embeddings) */
    /* Rows of the embedding table and the head's weight, >= vocab (0: vocab): padding for
     * speed; the head computes only vocab logits (gp_linear_padded). */
    int vocab_padded;
    int max_len; /* rows of the learned positions, >= seq_len (0: seq_len) */
} gp_transformer_config;
gp_transformer_config gp_transformer_defaults(void); /* T1: 256, 512, 8, 2048, 8, 128, 0 */
/* GPT-2 small (the "gpt2" family): vocab 50257 padded to 50304, dim 768, 12 heads, d_ff 3072,
 * 12 layers, seq_len and max_len 1024, no dropout, tied embeddings. */
gp_transformer_config gp_gpt2_defaults(void);
/* A "transformer" or "gpt2" family config (JSON text, as gp_model_from_json_string takes it) as
 * the struct; *gpt2 says which family. Errors name origin and the key. */
gp_status gp_transformer_config_from_json(const char *json, const char *origin,
                                          gp_transformer_config *out, bool *gpt2);
/* The config as that JSON text (every key written) into buf; a buffer too small is an error. */
gp_status gp_transformer_config_json(const gp_transformer_config *c, const char *family,
                                     char *buf, size_t nbytes);
gp_status gp_model_transformer(const gp_transformer_config *c, gp_model **out);

typedef struct gp_convnet_config {
    int in_ch, height, width, classes;
    int ch1, ch2, hidden; /* 32, 64, 256 */
} gp_convnet_config;
gp_convnet_config gp_convnet_defaults(void); /* C1: 1x28x28, 10 classes */
gp_status gp_model_convnet(const gp_convnet_config *c, gp_model **out);

/* JSON config: {"family": "transformer", ...} or {"input": {...}, "layers": [...]}.
 * Unknown keys and layer kinds are errors naming the key and the file. */
gp_status gp_model_from_json_file(const char *path, gp_model **out);
gp_status gp_model_from_json_string(const char *json, const char *origin, gp_model **out);

/* ------------------------------------------------------------- optimizer */

typedef enum gp_optim_kind { GP_OPTIM_SGD = 0, GP_OPTIM_ADAMW = 1 } gp_optim_kind;

typedef struct gp_optim_opts {
    gp_optim_kind kind;
    float lr;           /* peak learning rate */
    float momentum;     /* SGD */
    float beta1, beta2; /* AdamW */
    float eps;          /* AdamW */
    float weight_decay; /* decoupled for AdamW, L2 for SGD; matrices only */
    int warmup_steps;   /* linear warm-up from 0 to lr */
    int total_steps;    /* cosine decay to min_lr over the rest; 0: constant after warm-up */
    float min_lr;
    /* total_steps split into this many cosine cycles of equal length (warm restarts, Loshchilov
     * and Hutter's SGDR), each from lr down to min_lr, the warm-up at the start of the first;
     * 0 or 1: one cycle */
    int lr_cycles;
    float clip_norm;    /* clip by global gradient norm; 0: off */
} gp_optim_opts;
gp_optim_opts gp_sgd_defaults(float lr, float momentum);
gp_optim_opts gp_adamw_defaults(float lr, float weight_decay);
/* The learning rate for 0-based step `step`. */
float gp_optim_lr_at(const gp_optim_opts *o, int step);
/* Times the optimizer step a pipeline stage runs after its last backward, on n trainable
 * elements of a one-thread CPU device: the gradients' sum of squares (the global norm), their
 * scaling when o->clip_norm > 0 (counted whether or not the norm would clip), the update with
 * weight decay, and the gradients cleared. *s_per_elem: the median of `reps` steps (0: 3) after
 * a warm-up, in the thread's CPU time, divided by n (at most 2^28; 0: 2^22, past the caches).
 * The planner's gp_pipeline_opts.optim_s_per_param. */
gp_status gp_optim_profile(const gp_optim_opts *o, int64_t n, int reps, double *s_per_elem);

/* ---------------------------------------------------------------- loss */

/* Softmax cross-entropy over the last dimension of logits (rows, classes).
 * labels: one int32 per row; -1 rows are ignored. The loss is the sum over
 * non-ignored rows divided by `normalizer` (the count of non-ignored rows of
 * the whole mini-batch, so that micro-batch losses add up to the mean).
 * dlogits (may be NULL) receives d(loss)/d(logits). */
gp_status gp_softmax_xent(const gp_tensor *logits, const gp_tensor *labels, double normalizer,
                          double *loss, gp_tensor *dlogits);
/* The same against targets smoothed by `smoothing` in [0, 1) (PyTorch's
 * CrossEntropyLoss(label_smoothing=...)): each row's target puts 1 - smoothing
 * + smoothing / classes on its label and smoothing / classes on every other
 * class; 0 is gp_softmax_xent, bit for bit. */
gp_status gp_softmax_xent_smoothed(const gp_tensor *logits, const gp_tensor *labels,
                                   double normalizer, double smoothing, double *loss,
                                   gp_tensor *dlogits);
/* Number of labels that are not -1. */
int64_t gp_count_labels(const gp_tensor *labels);

/* ------------------------------------------------------------ inference */

/* Inference forward in eval mode (batch norm uses running stats, no dropout): every layer runs
 * on the device its parameters live on (a pipeline's stages, between steps: the activation
 * moves from stage to stage). x: (B, ...) as the model's input, in host memory or on any
 * device; logits (allocated by the caller with the model's output shape) likewise. Under MPI
 * use gp_pipeline_predict, which runs through every rank's stage. */
gp_status gp_model_predict(gp_model *m, const gp_tensor *x, gp_tensor *logits);
/* Loss summed over the labelled rows, and correct predictions (argmax == label) of a batch,
 * in eval mode; labels -1 are not counted. */
gp_status gp_model_evaluate(gp_model *m, const gp_tensor *x, const gp_tensor *y,
                            double *loss_sum, int64_t *ncorrect, int64_t *ncount);
/* gp_model_evaluate's figures from logits already computed for views of the same examples
 * (an image and its mirror image, say): logits[0..views-1], float32 of one shape (..., classes)
 * anywhere, y int32 with one label per row. views 1: the same bits as gp_model_evaluate's;
 * more: each row's prediction is the mean of its views' softmax, its loss -log of that mean's
 * entry at the label (in double). Labels -1 are not counted. */
gp_status gp_score_views(int views, const gp_tensor *logits, const gp_tensor *y,
                         double *loss_sum, int64_t *ncorrect, int64_t *ncount);

/* ---------------------------------------------------------------- data */

/* Fashion-MNIST / MNIST IDX files, gzip-compressed or plain. */
typedef struct gp_idx_dataset {
    int64_t n;         /* examples */
    int rows, cols;    /* 28 x 28 */
    uint8_t *images;   /* n * rows * cols */
    uint8_t *labels;   /* n */
} gp_idx_dataset;
/* Reads an images file and a labels file; counts and magics are checked. */
gp_status gp_idx_load(const char *images_path, const char *labels_path, gp_idx_dataset *out);
/* dir/train-images-idx3-ubyte(.gz) etc.; split: "train" or "t10k". */
gp_status gp_idx_load_dir(const char *dir, const char *split, gp_idx_dataset *out);
void gp_idx_free(gp_idx_dataset *d);
/* Fills x (B, 1, rows, cols) f32, scaled to [0,1] then (v - mean) / std, and
 * y (B) int32 with the examples idx[0..B-1]. */
gp_status gp_idx_batch(const gp_idx_dataset *d, const int64_t *idx, int64_t batch, float mean,
                       float std, gp_tensor *x, gp_tensor *y);

/* A byte-level text corpus with a train/validation split. */
typedef struct gp_text_corpus {
    uint8_t *train;
    int64_t ntrain;
    uint8_t *valid;
    int64_t nvalid;
    int nfiles;  /* files read */
} gp_text_corpus;
/* Reads every fortune file under `path` (a file or a directory, recursively;
 * `.dat` index files skipped), entries separated by "%" lines. Every
 * `valid_every`-th entry (e.g. 20) goes to validation. */
gp_status gp_text_load(const char *path, int valid_every, gp_text_corpus *out);
/* The default multilingual corpus: /usr/share/games/fortunes (seven languages). */
#define GP_FORTUNES_DIR "/usr/share/games/fortunes"
void gp_text_free(gp_text_corpus *c);
/* Fills x (B, T) with windows of bytes and y (B, T) with the next bytes.
 * Window b starts at starts[b]; each must be <= n - T - 1. */
gp_status gp_text_batch(const uint8_t *bytes, int64_t n, const int64_t *starts, int64_t batch,
                        int seq_len, gp_tensor *x, gp_tensor *y);

/* Pre-tokenized data: llm.c's token shards (256 int32 of header: magic 20240520, version 1, the
 * token count; then uint16 ids) or raw little-endian uint16 / uint32 ids. */
typedef enum gp_token_format { GP_TOKENS_LLMC = 0, GP_TOKENS_U16, GP_TOKENS_U32 } gp_token_format;
/* "llmc", "u16", "u32" */
const char *gp_token_format_name(gp_token_format f);
/* A token file memory-mapped read-only: ids points into the mapping. */
typedef struct gp_token_shard {
    const void *ids;  /* ntokens ids of width bytes each */
    int64_t ntokens;
    int width;        /* 2 or 4 */
    uint64_t offset;  /* byte offset of the first id in the file (1024 for llm.c's) */
    void *map;
    size_t map_size;
} gp_token_shard;
/* Maps path and checks it whole before returning: llm.c's magic, version and token count
 * against the file's size, a raw file's size a whole number of ids, and every id below vocab
 * (1 to 2^31). A bad file is GP_FORMAT naming the file and the byte offset of what is wrong
 * (the first id out of range among them). */
gp_status gp_tokens_open(const char *path, gp_token_format fmt, uint64_t vocab,
                         gp_token_shard *out);
void gp_tokens_close(gp_token_shard *s);
/* gp_text_batch over ids of width 1, 2 or 4 bytes: x (B, T) the windows at starts[b], y the
 * next ids; each start must be <= n - T - 1. */
gp_status gp_tokens_batch(const void *ids, int width, int64_t n, const int64_t *starts,
                          int64_t batch, int seq_len, gp_tensor *x, gp_tensor *y);

/* A byte-level BPE tokenizer read from a Hugging Face tokenizer.json (model.type "BPE",
 * decoder "ByteLevel": GPT-2's scheme): each id decodes to the bytes its token stands for, an
 * added token to its content. Errors name the file and the entry. */
typedef struct gp_tokenizer gp_tokenizer;
gp_status gp_tokenizer_load(const char *path, gp_tokenizer **out);
void gp_tokenizer_free(gp_tokenizer *t);
/* Ids 0..size-1 (the largest id + 1; an id in a gap is no token). */
int64_t gp_tokenizer_size(const gp_tokenizer *t);
/* The bytes of one token, owned by t. */
gp_status gp_tokenizer_token(const gp_tokenizer *t, int64_t id, const uint8_t **bytes,
                             size_t *len);
/* The bytes of n ids, malloc'd (and NUL-terminated past *len); the caller frees *out. */
gp_status gp_tokenizer_decode(const gp_tokenizer *t, const int32_t *ids, int64_t n, uint8_t **out,
                              size_t *len);
/* The ids of n bytes of UTF-8 text: split at added tokens, then into GPT-2's pre-tokens (its
 * pattern, with Unicode letters, numbers and white space), each pre-token's bytes merged by
 * model.merges; *ids malloc'd. GP_UNSUPPORTED for a file whose normalizer or pre-tokenizer is
 * not GPT-2's (it still decodes). */
gp_status gp_tokenizer_encode(const gp_tokenizer *t, const uint8_t *text, size_t n,
                              int32_t **ids, int64_t *nids);

/* A permutation of 0..n-1 keyed by (seed, epoch): same on every machine. */
gp_status gp_shuffle(uint64_t seed, uint32_t epoch, int64_t n, int64_t *perm);

/* ---------------------------------------------------------------- BLAS */

/* Which kernels OpenBLAS chose for this CPU ("Zen", "Haswell", ...; another CBLAS: "unknown"). */
const char *gp_blas_corename(void);
/* Which variant of gpipe's own CPU kernels runs. The library carries them compiled for several
 * instruction sets: "baseline" (any x86-64, or another CPU), "avx2" (x86-64-v3: AVX2, FMA,
 * BMI2, F16C, ...), "avx512" (x86-64-v4: AVX-512 F, BW, CD, DQ, VL), and in a build configured
 * with -DGP_NATIVE=ON "native" (-march=native). The fastest one this CPU runs is chosen once,
 * at the first call or CPU device, unless the environment's GP_CPU_ISA names one. Every variant
 * gives the same bits, except that baseline has no AVX2 convolution paths (Winograd's, the
 * direct tile). *name is the variant in use; the status is GP_OK, or where GP_CPU_ISA names a
 * variant that is unknown or not built (GP_INVALID_ARGUMENT) or that this CPU lacks the
 * instructions for (GP_UNSUPPORTED), that error, which making a CPU device then fails with. */
gp_status gp_cpu_isa(const char **name);
/* The variants this build carries that this CPU runs, fastest first: "avx512, avx2, baseline". */
const char *gp_cpu_isa_runnable(void);
/* An output file written atomically: text goes to a temporary file beside
 * `path`; gp_file_out_close(o, true) checks every write, fsyncs, renames it
 * onto `path` and fsyncs the folder, so a crash or failure never leaves a
 * half-written file under that name nor replaces a good one. The struct is
 * the caller's (on the stack); close it exactly once after a successful open. */
typedef struct gp_file_out {
    FILE *f;
    char *tmp;        /* path.tmp.PID */
    const char *path; /* borrowed: must outlive the close */
    int err;          /* first errno seen, 0 if none */
    const char *what; /* first failure, NULL if none */
} gp_file_out;
gp_status gp_file_out_open(gp_file_out *o, const char *path);
/* Append; the first failure is kept and reported by gp_file_out_close. */
void gp_file_out_printf(gp_file_out *o, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void gp_file_out_write(gp_file_out *o, const char *text);
/* Raw bytes (binary files); failures are kept as for text. */
void gp_file_out_write_bytes(gp_file_out *o, const void *data, size_t nbytes);
/* commit: flush, fsync, rename onto the path, fsync the folder; !commit (or
 * any failure so far): remove the temporary file. Returns the first failure,
 * naming the path and the step that failed. */
gp_status gp_file_out_close(gp_file_out *o, bool commit);

/* ---------------------------------------------------------- pipeline plan */

/* How a mini-batch flows through K stages. Zero-initialized: one stage, one
 * micro-batch, the GPipe schedule with re-materialization, no memory limit. */
/* GPIPE: fill-drain; 1F1B: one forward, one backward; ZBH1: zero bubble H1, each backward
 * split into its input gradient and its weight gradients, the latter run where 1F1B idles, at
 * 1F1B's activation memory (plus the output gradients a weight part reads); INTERLEAVED:
 * interleaved 1F1B, each stage running V cells (gp_pipeline_opts.chunks) that go round the
 * stages V times (the model is cut into K V cells), which divides 1F1B's bubble by about V for
 * V times the messages; M must be a multiple of K. ZBV: zero bubble V, two cells per stage
 * placed down the stages and back up (stage k runs cells k and 2K - 1 - k), backwards split as
 * ZBH1's, at 1F1B's first-stage activation memory on every stage. */
typedef enum gp_schedule_kind {
    GP_SCHEDULE_GPIPE = 0,
    GP_SCHEDULE_1F1B = 1,
    GP_SCHEDULE_ZBH1 = 2,
    GP_SCHEDULE_INTERLEAVED = 3,
    GP_SCHEDULE_ZBV = 4
} gp_schedule_kind;
/* CELL (GPipe, the default): keep only each cell's input per micro-batch and
 * recompute the cell's forward during backward. NONE: keep every layer's
 * saved state for each micro-batch in flight. SELECTIVE: per cell, NONE where
 * the cell fits the memory limit that way and CELL where only recomputing
 * fits (no limit: every cell NONE); the partitioner balances the cells'
 * time with the recomputation counted, so it may move layers to spare a
 * cell its recomputation. */
typedef enum gp_remat {
    GP_REMAT_CELL = 0,
    GP_REMAT_NONE = 1,
    GP_REMAT_SELECTIVE = 2
} gp_remat;
/* How each stage sums its weight gradients over the micro-batches and the replicas.
 * SEQUENTIAL adds micro-batch after micro-batch into the gradient block and the D replicas' sums
 * with MPI's all-reduce: bitwise for every K, schedule and remat mode at a fixed D. TREE fixes the
 * shape of the sum over the mini-batch's D M micro-batches: blocks of q consecutive micro-batches
 * (q the odd part of M) added in order, then a binary tree over the blocks whose top levels are
 * the replicas (paired in rank order): with D a power of two the parameters are the same bits
 * for every D as well. It holds log2(M / q) extra gradient buffers per cell, and more while a
 * zero-bubble schedule's weight parts trail. */
typedef enum gp_grad_sum {
    GP_GRAD_SUM_SEQUENTIAL = 0,
    GP_GRAD_SUM_TREE = 1
} gp_grad_sum;
const char *gp_grad_sum_name(gp_grad_sum g); /* "sequential", "tree" */

/* How the stages are started: THREADS, in this process (K = 1: on the caller's thread, with no
 * stage thread and no transport; K > 1: one thread per stage); MPI, one process per stage and
 * replica, started by mpirun or srun (needs a build with MPI, see gp_mpi_built). Where a stage's
 * tensors live and its kernels run is its device (gp_pipeline_opts.devices). */
typedef enum gp_launcher { GP_LAUNCHER_THREADS = 0, GP_LAUNCHER_MPI = 1 } gp_launcher;
const char *gp_launcher_name(gp_launcher l); /* "threads", "mpi" */
/* How the MPI launcher's ranks on CUDA GPUs exchange stage messages and sum gradients over the
 * replicas. AUTO: NCCL where the build has it (GP_NCCL) and every rank has a GPU of its own,
 * else MPI with host staging (gp_pipeline_gpu_comm says which, and why); NCCL: that or an
 * error naming why not; MPI: host staging always. CPU ranks always use MPI. */
typedef enum gp_gpu_comm { GP_GPU_COMM_AUTO = 0, GP_GPU_COMM_NCCL = 1, GP_GPU_COMM_MPI = 2 } gp_gpu_comm;
const char *gp_gpu_comm_name(gp_gpu_comm c); /* "auto", "nccl", "mpi" */
/* "gpipe", "1f1b", "zbh1", "interleaved", "zbv"; and back: the kind of that name, or
 * GP_INVALID_ARGUMENT naming the kinds (*kind untouched). */
const char *gp_schedule_kind_name(gp_schedule_kind s);
gp_status gp_schedule_kind_parse(const char *name, gp_schedule_kind *kind);
/* The cells per stage a schedule kind runs, given the asked number (0: its default): 1 for
 * gpipe, 1f1b and zbh1; interleaved: chunks, default 2 (1 to 64); zbv: 2. An error for a number
 * the kind cannot run. */
gp_status gp_schedule_kind_chunks(gp_schedule_kind kind, int chunks, int *out);
const char *gp_remat_name(gp_remat r);                 /* "cell", "none", "selective" */

/* What the cells are balanced on: the layers' FLOP estimates (COST), or their
 * forward + backward times measured by gp_model_profile_layers (TIME). */
typedef enum gp_balance { GP_BALANCE_COST = 0, GP_BALANCE_TIME = 1 } gp_balance;
const char *gp_balance_name(gp_balance b); /* "cost", "time" */

/* The kind of the stage devices a pipeline makes (gp_pipeline_opts.device_type). Each kind is
 * an entry of the library's registry of device kinds, which these calls ask:
 * gp_device_type_name: "cpu", "cuda" (gp_device_kind of its devices); "unknown" for a value that
 * is no kind. gp_device_type_parse: the kind of that name, or GP_INVALID_ARGUMENT naming the
 * kinds. gp_device_type_count: the devices of the kind this process can reach, at least 1 on
 * GP_OK: 1 for the CPU (the host), the GPUs visible for CUDA (as gp_cuda_device_count, loading
 * the CUDA module the first time). gp_device_type_new: a device of the kind named name, device
 * `index` (>= 0) mod the count (GPU index mod the GPUs; every CPU device is the host's), with
 * `threads` threads where the kind runs its kernels on host threads (the CPU: 1 to 1024; CUDA
 * ignores it); failing as the kind's own constructor does. gp_device_type_memory: the bytes
 * device `index` (>= 0) of the kind can still give, into *available: the host's available
 * memory for the CPU (MemAvailable of /proc/meminfo, else its free pages; every CPU device
 * shares it), the free memory of GPU index mod the GPUs for CUDA (cudaMemGetInfo); failing as
 * gp_device_type_count does where there is no such device, and with GP_UNSUPPORTED where the
 * amount is not known. */
typedef enum gp_device_type { GP_DEVICE_CPU = 0, GP_DEVICE_CUDA = 1 } gp_device_type;
const char *gp_device_type_name(gp_device_type type);
gp_status gp_device_type_parse(const char *name, gp_device_type *type);
gp_status gp_device_type_count(gp_device_type type, int *count);
gp_status gp_device_type_new(gp_device_type type, const char *name, int index, int threads,
                             gp_device **out);
gp_status gp_device_type_memory(gp_device_type type, int index, uint64_t *available);

/* Bounds of the pipeline and planning options the library checks (a front end can check its
 * own against the same): the most devices of one mesh axis (tensor_parallel, data_parallel) or
 * of a plan search (gp_plan_search_opts.devices), and the most threads of a stage device
 * (stage_threads). */
#define GP_MAX_DEVICES 4096
#define GP_MAX_STAGE_THREADS 1024

typedef struct gp_pipeline_opts {
    int stages;        /* K >= 1 (0 means 1) */
    int micro_batches; /* M >= 1 (0 means 1); the batch must divide by it */
    gp_schedule_kind schedule;
    /* Cells per stage V (0: the schedule's default; 2 for INTERLEAVED, 2 for ZBV, which runs no
     * other, 1 for the others, which run one): the model is cut into K V cells, cell v K + k on
     * stage k (ZBV: cells k and 2K - 1 - k). */
    int chunks;
    gp_remat remat;
    gp_grad_sum grad_sum;
    /* optional: first layer of each of the K V cells (K V entries) */
    const int *partition;
    uint64_t memory_limit; /* per-device bytes, 0: none */
    /* The mini-batch the cells are balanced and fitted for (the runtime; the
     * plan takes it as an argument). 0: unknown, balanced at one example per
     * micro-batch, which ranks cells alike when every layer's cost grows
     * with the batch; the memory limit is then checked at that size too. */
    int64_t batch;
    gp_balance balance;
    /* Measured seconds per layer (gp_model_profile_layers' fwd_s + bwd_s
     * order: L forward times then L backward times) for GP_BALANCE_TIME;
     * NULL: gp_pipeline_new profiles the layers itself (gp_plan_make, which
     * allocates nothing, needs them given). */
    const double *layer_times;
    /* layer_times holds 4L entries (gp_model_profile_layers_split): then the
     * schedules that split backwards (zbh1, zbv) are timed by the measured
     * input and weight parts; otherwise they take the weight part as its share
     * of the backward's FLOPs and the split as costing nothing. */
    bool layer_times_split;
    /* Runtime: stage k's thread runs on core k x stage_threads of those the process may use
     * when there are at least K x stage_threads of them; true keeps the scheduler's choice. */
    bool no_pinning;
    /* Threads of each CPU stage device the pipeline makes (0 means 1). Bit-identical results
     * across K hold for the same threads per device (gp_device_cpu_new_threads). */
    int stage_threads;
    /* Processes (see "MPI launcher" below); zeroed: this process runs every stage. */
    gp_launcher launcher;
    int data_parallel;     /* D >= 1 replicas (0 means 1); MPI only */
    /* Longest wait on another stage (a thread or a rank) before the step fails naming it;
     * 0: 60 s. */
    double comm_timeout_s;
    /* Optional: the device of each stage (K entries; with tensor_parallel T > 1, K x T: stage
     * k's shard t at k T + t; under MPI only this rank's entry is used), borrowed: the caller
     * frees them after the pipeline. NULL: the pipeline makes a CPU device per stage
     * ("stage<k>", or "stage<k>.<t>" per shard, with memory_limit and stage_threads threads each), except that with K = 1, T = 1
     * and a model already initialized on one device, that device is used. memory_limit is not
     * applied to the caller's devices: they keep their own limits. */
    gp_device **devices;
    /* The kind of the devices the pipeline makes when devices is NULL: CPU (the default) or
     * CUDA GPUs; stage shard w is gp_device_type_new(device_type, name, w, stage_threads), with
     * memory_limit (on CUDA: GPU w mod the GPUs visible, under MPI a rank's GPU l mod them, l
     * its rank among its node's ranks; failing as gp_cuda_device_count does where there is
     * none). Not yet run on a GPU. */
    gp_device_type device_type;
    /* MPI launcher on CUDA devices: NCCL or MPI between the ranks (gp_gpu_comm); 0: AUTO. */
    gp_gpu_comm gpu_comm;
    /* The GEMM arithmetic of every stage device the pipeline uses or makes, the caller's devices
     * included (gp_device_set_precision); 0: FP32. */
    gp_precision precision;
    /* T >= 1 tensor-parallel shards per stage (0 means 1): the mesh is D x K x T devices. Each
     * layer whose kind has a layout is split over the T shards of its stage (the Transformer
     * block by heads and d_ff, the token embedding and a last linear layer, the vocabulary
     * head, by vocabulary; the rest replicated), each shard holding its part of the parameters,
     * gradients and optimizer state on its own device. Threads: K x T stage threads; MPI: D x K x T
     * ranks. A layout that does not divide by T is an error naming the layer, the dimension and
     * the mesh axis. Same seed: fixed T gives bit-identical parameters for every K and schedule;
     * across T they agree to rounding (a row-split product adds its partial sums in another
     * order). */
    int tensor_parallel;
    /* Planning only (gp_plan_make): bandwidth in GB/s of the links the collectives cross, to
     * time the tensor axis's all-reduces and the data axis's gradient all-reduce; 0: their
     * bytes are counted, not timed. */
    double link_gbytes_per_s;
    /* Planning only (gp_plan_make): seconds the optimizer step takes per trainable element a
     * device holds (gp_optim_profile), added to each stage's step; 0: the optimizer step is not
     * modelled. gp_plan_search measures it itself (balance TIME) when this is 0. */
    double optim_s_per_param;
    /* Planning only (gp_plan_make): seconds each action of a stage (a micro-batch's forward,
     * backward, or a split backward's part) costs beyond its layers' compute: the runtime's
     * hand-offs between stages, which thin micro-batches make count (measured by running a
     * pipeline of a tiny model, as `gpipe train --plan auto` does); 0: not modelled. */
    double action_s;
    /* Training: the loss's targets smoothed by this in [0, 1) (gp_softmax_xent_smoothed); 0:
     * the plain cross-entropy. With a vocabulary split over T > 1 shards as well (a third sum
     * per row all-reduced). */
    double label_smoothing;
} gp_pipeline_opts;

/* The one check of po, what gp_plan_make and gp_pipeline_new make first: every field within its
 * bounds and the fields together (chunks the schedule runs, interleaved's micro-batches a
 * multiple of the stages, balance by time only without shards); with m (may be NULL: skipped)
 * at least one layer per cell; with a mini-batch of `batch` examples (0: not known, skipped) the
 * batch dividing into D replicas x M micro-batches. Fields other calls check against their
 * other arguments (the partition against the model, a device's memory) are not checked here.
 * On failure the message starts with the field at fault, named as in gp_pipeline_opts
 * ("micro_batches 3: does not divide the batch of 16 examples"; "batch" for the batch), and
 * *field (may be NULL) gets that name, for a front end to show its own name for it; NULL on
 * success. */
gp_status gp_pipeline_opts_check(const gp_model *m, int64_t batch, const gp_pipeline_opts *po,
                                 const char **field);

/* Measures each layer of m alone, as a pipeline stage would run it: the layer
 * is initialized on a scratch device (so m need not fit on one), then its
 * training-mode forward and its backward on one micro-batch of `micro_batch`
 * examples (stand-in inputs and output gradients) are timed on a one-thread
 * CPU device, and the layer is released again. Times are the thread's CPU
 * time (time other processes hold the core is not the layer's). Each figure
 * is the mean of `reps` runs (reps 0: 6; a step is a sum of many runs), taken
 * in up to 3 passes over the layers, each a warm-up run then its share of the
 * runs of every layer, so that a drift in the machine's speed weighs on all
 * layers alike; layers
 * alike (the same kind, shapes and cost: a Transformer's blocks) are timed
 * once. times: 2L entries, forward seconds of layers 0..L-1 then backward
 * seconds. m must not be initialized (no trainer or pipeline holds it). */
gp_status gp_model_profile_layers(gp_model *m, int64_t micro_batch, int reps, double *times);
/* The same, times: 4L entries, and a backward split in two as the zero-bubble schedules run it
 * besides: L forward times, L backward times, then L input-part times and L weight-part times
 * (a kind without weights runs whole in its input part: weight part 0). */
gp_status gp_model_profile_layers_split(gp_model *m, int64_t micro_batch, int reps,
                                        double *times);

/* How much slower layer li's training forward and backward run inside a stage of a pipeline of
 * n devices at work than the layer-alone profile (gp_model_profile_layers) times them: n
 * threads, one per core this process may use when it has n, each with `copies` copies of the
 * layer (their own parameters) on a one-thread CPU device, run them together, in step, as a
 * stage does: for each of `inflight` micro-batches of `micro_batch` examples the copies'
 * forwards, all kept, then their backwards; beside the first thread's run alone as the profile
 * runs the layer (one copy, one micro-batch's forward and backward at a time, as many times);
 * 5 rounds after a warm-up, thread CPU time. *factor = the median over the rounds of their mean
 * time per forward and backward over the alone one (1 for n = 1; n at most 256, copies and
 * inflight at most 64). What differs: the parameters and state that stream through the caches,
 * and the memory system shared with the other stages. m need not be initialized. */
gp_status gp_model_profile_contention(const gp_model *m, int li, int64_t micro_batch, int n,
                                      int copies, int inflight, double *factor);
/* Scales measured layer times (`groups` groups of L: gp_model_profile_layers' 2 or
 * gp_model_profile_layers_split's 4) by how much slower they run in a stage of `devices` stage
 * devices at work: gp_model_profile_contention of the slowest layer (forward + backward) at
 * micro_batch, with as many copies as a stage holds of layers like it (the model's over the
 * devices; at most 4, their parameters at most 64 MiB) and as many micro-batches in flight as
 * make 16 examples over the copies (at least 1, at most 8), on at most as many devices as the
 * cores this process may use (a larger mesh spans machines). devices 1: unchanged.
 * *factor (may be NULL): the factor applied. What gp_plan_search and gpipe plan --balance time
 * predict with. */
gp_status gp_layer_times_contend(const gp_model *m, int64_t micro_batch, int devices, int groups,
                                 double *times, double *factor);

/* One cell of a plan. Times are seconds at the plan's GFLOP/s; bytes follow
 * the planner's memory model (static state, plus the activations the
 * schedule holds at its peak). */
typedef struct gp_plan_cell {
    int first, last;             /* layers first..last, inclusive */
    int stage, chunk;            /* the stage (device) running it, and which of its cells */
    gp_remat remat;              /* the cell's own: CELL or NONE (plan remat SELECTIVE: each) */
    /* Bytes per step one device of the cell gives to collectives and links: its tensor axis's
     * all-reduces (forward, recomputation and backward of every micro-batch), its activations
     * and gradients to the neighbouring stages, and (data parallel) its gradients to the
     * replicas' all-reduce. */
    uint64_t tensor_bytes, pipe_bytes, data_bytes;
    int64_t nparams;             /* trainable elements */
    double fwd_flops, bwd_flops; /* one micro-batch */
    double time_s;               /* one micro-batch forward + backward (what is balanced) */
    double opt_s;                /* the optimizer step on the cell's nparams, per step
                                  * (po->optim_s_per_param; 0 when not modelled) */
    /* grad_bytes: the gradients with the buffers their sums keep beside them from step to step
     * (grad_sum TREE's partial sums; data parallel over MPI: each bucket's partner sum and, on
     * a GPU, host copy), as the stage's device counts them */
    uint64_t param_bytes, grad_bytes, optim_bytes;
    /* At the stage's simulated peak: stashed micro-batches + one rebuilt in backward; with V
     * cells per stage, this cell's share of it (the shares add up to the stage's). */
    uint64_t peak_act_bytes;
    /* Beside those at the peak: the backward's gradients and kernel workspace, and the messages
     * sent and not yet reclaimed (the memory model of the partitioner, an upper bound); with V
     * cells per stage, the gradients and workspace only on the cell with the stage's largest (a
     * stage runs one action at a time), the messages on every cell. */
    uint64_t transient_bytes;
    uint64_t total_bytes;        /* params + grads + optimizer state + peak activations + transient */
    int peak_in_flight;          /* most micro-batches forwarded and not yet backwarded */
    double busy_s, idle_s;       /* per step, simulated (busy includes recomputation) */
} gp_plan_cell;

typedef struct gp_plan {
    int stages, micro_batches;
    int chunks, ncells;      /* V cells per stage, K V cells (the entries of cells) */
    int tensor_parallel, data_parallel; /* T and D: every figure per device is one shard's */
    int64_t batch, micro_batch_size;
    gp_schedule_kind schedule;
    gp_remat remat;
    uint64_t memory_limit;
    gp_plan_cell *cells;     /* (ncells), owned; freed by gp_plan_free. With V > 1 each cell's
                              * peak_in_flight, busy_s and idle_s are its stage's, and its bytes
                              * count at most M of its own micro-batches in flight */
    double step_s;           /* simulated step time, with the collectives' time at
                              * po->link_gbytes_per_s and each stage's optimizer step at
                              * po->optim_s_per_param (not modelled when that is 0) */
    double comm_s;           /* of it, the tensor axis's all-reduces on the slowest stage and the
                              * data axis's gradient all-reduce (not overlapped) */
    double bubble_simulated; /* idle / (K * step) from the simulated schedule */
    double bubble_theory;    /* (K-1)/(M+K-1); V cells per stage (interleaved, zbv): (K-1)/(V M+K-1) */
    double gflops_assumed;   /* the rate every FLOP figure was turned into seconds at */
    gp_balance balance;      /* TIME: cell times are measured seconds, not FLOPs / gflops */
} gp_plan;

/* Partitions m for a mini-batch of `batch` examples and simulates the
 * schedule, without allocating any tensor. The partition is the exact
 * min-max balance of the layers' FLOP estimates within po->memory_limit
 * (po->partition, when given, is checked instead); per-cell times come from
 * those estimates at `gflops` GFLOP/s (e.g. the measured sgemm ceiling).
 * po->balance TIME: balanced on, and timed by, po->layer_times (required)
 * instead; gflops is then unused. po->batch is ignored (`batch` is used). It
 * gives the same cells gp_pipeline_new picks for the same options and batch.
 * Optimizer state per trainable parameter: SGD with momentum 1, without 0,
 * AdamW 2 (o NULL: none). The memory limit is checked with the micro-batches
 * each schedule keeps in flight: M for gpipe, min(K - k, M) on stage k for 1f1b, min(K, M)
 * (and as many waiting for their weight parts) for zbh1. The caller
 * frees *out with gp_plan_free; on failure *out is left zeroed (nothing to free).
 * Errors name the numbers: the options as gp_pipeline_opts_check names them (the impossible K,
 * the batch not divisible by M, ...), or the cell/layer that cannot fit and by how much. */
gp_status gp_plan_make(const gp_model *m, int64_t batch, const gp_optim_opts *o,
                       const gp_pipeline_opts *po, double gflops, gp_plan *out);
void gp_plan_free(gp_plan *p);
/* The fullest stage's total bytes (its cells' together): what the fullest device of the plan
 * holds at its peak. */
uint64_t gp_plan_fullest_bytes(const gp_plan *p);

/* What gp_plan_search may choose. Zero fields are searched; others fixed. */
typedef struct gp_plan_search_opts {
    int devices;          /* N >= 1: every plan uses D x K x T = N of them */
    int stages;           /* K; 0: every K dividing N / T, up to the layers */
    int micro_batches;    /* M; 0: every divisor of the replica's batch */
    int data_parallel;    /* D; 0: N / (K T) */
    unsigned schedules;   /* bit (1 << kind) per schedule allowed; 0: all (interleaved and zbv
                           * where they run: K > 1, K V layers; interleaved: K dividing M) */
    int chunks;           /* interleaved's V; 0: 2, 3 and 4 */
    unsigned remats;      /* bit (1 << mode) per remat mode allowed; 0: all (selective only
                           * under a memory limit, where it differs from none) */
    int max_plans;        /* how many of the fastest to keep (0 means 5) */
    /* Optional: called after each plan tried, with how many are tried so far and in all. */
    void (*progress)(void *ctx, int done, int total);
    void *progress_ctx;
} gp_plan_search_opts;

typedef struct gp_plan_search_result {
    gp_plan *plans;  /* n of them, the fastest first; owned */
    int n;
    int candidates;  /* plans tried */
    int fitting;     /* of them, within the memory limit */
} gp_plan_search_result;

/* Searches K, D = N / (K T), M among the divisors of the batch, the schedule and the remat
 * mode for the fastest simulated step (gp_plan_make's step_s) that fits base->memory_limit,
 * with base's other settings (memory limit, threads per stage, T, link bandwidth, balance).
 * Ties go to fewer micro-batches (FLOP estimates do not see that larger micro-batches run
 * faster), then fewer bytes on the fullest device, fewer stages, the schedule and remat mode
 * in enum order: the same inputs give the same choice. Balance TIME
 * profiles the layers once per micro-batch size tried (m must then be uninitialized, as for
 * gp_model_profile_layers), scales them by the contention of each number of devices tried
 * (gp_layer_times_contend, once per size and number) and times the optimizer step
 * (gp_optim_profile, unless base->optim_s_per_param is set); base->layer_times and base->partition must be NULL. When no plan
 * fits, GP_MEMORY_LIMIT names the plan needing the least memory and its bytes. The caller
 * frees *out with gp_plan_search_free; on failure it is left empty. */
gp_status gp_plan_search(gp_model *m, int64_t batch, const gp_optim_opts *o,
                         const gp_pipeline_opts *base, double gflops,
                         const gp_plan_search_opts *so, gp_plan_search_result *out);
void gp_plan_search_free(gp_plan_search_result *r);
/* --------------------------------------------------------- training */

/* A model trained as K cells on K stage devices over M micro-batches, one synchronous update
 * per step: the one training handle, whatever K (K = 1 is single-device training, run inline).
 * Same seed and M: losses and parameters are bit-identical for every K, schedule and
 * re-materialization mode, and across launchers, with devices of the same thread count. */
typedef struct gp_pipeline gp_pipeline;

/* Partitions m (po->partition, or the balance of the layers' cost estimates or times), validates
 * the schedule and places each cell's layers on its stage device in flat blocks (parameters,
 * gradients, optimizer state). o NULL: a pipeline for inference only (gp_pipeline_predict,
 * evaluate, hash, checkpoint loads), without gradients or optimizer state; it takes no step. The parameters: a model whose layers all hold values is taken
 * as it is (its values are moved to the stage devices where they live elsewhere, with no
 * re-initialization); a model none of whose layers is initialized is initialized there from
 * `seed` (the values equal gp_model_init with that seed); a partly initialized model is an
 * error naming the first layer without values. seed also keys dropout; 0 uses the model's init
 * seed. po NULL: the zeroed defaults. Errors name the numbers: the options as
 * gp_pipeline_opts_check names them against m and po->batch (K < 1, M < 1, K greater than the
 * number of layers, ...), and data_parallel > 1 without the MPI launcher. The pipeline borrows
 * m: free it first. */
gp_status gp_pipeline_new(gp_model *m, const gp_optim_opts *o, const gp_pipeline_opts *po,
                          uint64_t seed, gp_pipeline **out);
/* One step: x (B, ...) is read by stage 0 only, y (int32 labels, (B) or (B, T)) by the last
 * stage only, either in host memory or on any device; B must divide by M. *loss: the
 * mini-batch mean loss. A failure on any stage stops all of them; the first error is returned,
 * no update is made and the next step can run. */
gp_status gp_pipeline_step(gp_pipeline *p, const gp_tensor *x, const gp_tensor *y, float *loss);
/* Stops the pipeline and releases its gradients and optimizer state. Parameters on devices the
 * pipeline made go with them (those layers are left uninitialized); parameters on the caller's
 * devices stay with the model. NULL is ignored. */
void gp_pipeline_free(gp_pipeline *p);
int gp_pipeline_stages(const gp_pipeline *p); /* K: devices along the pipeline */
int gp_pipeline_cells(const gp_pipeline *p);  /* K V: the model's cells (V per stage) */
int gp_pipeline_micro_batches(const gp_pipeline *p);
int gp_pipeline_tensor_parallel(const gp_pipeline *p); /* T */
/* Memory counters of stage `stage`'s shard `shard` (0 <= shard < T); gp_pipeline_mem_stats gives
 * shard 0's. Under MPI another rank's: after gp_pipeline_gather (replica 0's). */
gp_status gp_pipeline_mem_stats_shard(const gp_pipeline *p, int stage, int shard,
                                      gp_mem_stats *out);
/* The first layer of cell k (0 <= k < K V: the partition in use), or -1 when k is out of range. */
int gp_pipeline_cell_first(const gp_pipeline *p, int k);
/* Whether cell k recomputes its forward in backward (GP_REMAT_CELL) or keeps its state
 * (GP_REMAT_NONE), as the run chose it (remat SELECTIVE: per cell); GP_REMAT_CELL when k is
 * out of range. */
gp_remat gp_pipeline_cell_remat(const gp_pipeline *p, int k);
/* The device of stage k, or NULL when k is out of range (under MPI: another rank's stage). */
gp_device *gp_pipeline_device(const gp_pipeline *p, int k);
/* Memory counters of stage `stage`'s device. */
gp_status gp_pipeline_mem_stats(const gp_pipeline *p, int stage, gp_mem_stats *out);
/* Steps done; setting it (resuming from a checkpoint) sets the next step's learning rate,
 * AdamW bias correction and dropout keys. No step may be running. */
int gp_pipeline_steps_done(const gp_pipeline *p);
gp_status gp_pipeline_set_step(gp_pipeline *p, int steps_done);

/* Collective (every rank calls it under MPI; the results on every rank): the model in eval
 * mode through every stage: logits as gp_model_predict's, the loss sum and correct predictions
 * as gp_model_evaluate's, the parameter hash as gp_model_params_fnv1a64's, bit for bit. */
gp_status gp_pipeline_predict(gp_pipeline *p, const gp_tensor *x, gp_tensor *logits);
gp_status gp_pipeline_evaluate(gp_pipeline *p, const gp_tensor *x, const gp_tensor *y,
                               double *loss_sum, int64_t *ncorrect, int64_t *ncount);
/* Collective: gp_pipeline_evaluate over n batches (xs[i], ys[i]), the figures summed in batch
 * order: the same bits as n calls. An in-process pipeline with one cell per stage and no shards
 * runs the stages at once (stage k on batch i while stage k + 1 is on batch i - 1, each on its
 * core), so it takes about the slowest stage's time; others, and any with a device memory limit
 * (the stages at once hold up to three batches' activations each), go batch after batch. */
gp_status gp_pipeline_evaluate_batches(gp_pipeline *p, int n, const gp_tensor *xs,
                                       const gp_tensor *ys, double *loss_sum, int64_t *ncorrect,
                                       int64_t *ncount);
/* Collective: gp_pipeline_predict over n batches into logits[i] (float32 host tensors of the
 * output's shape), the same bits as n calls, the stages at once where evaluate_batches runs
 * them so. */
gp_status gp_pipeline_predict_batches(gp_pipeline *p, int n, const gp_tensor *xs,
                                      gp_tensor *logits);
gp_status gp_pipeline_params_fnv1a64(gp_pipeline *p, uint64_t *out);

/* Figures of the last step, from its recorded timeline: every stage's forward,
 * backward, recompute, send, receive, wait and optimizer events. */
typedef struct gp_pipeline_stats {
    int stages, micro_batches;
    double step_s;               /* wall time of the last step */
    double bubble_measured;      /* idle / (K x span) from the recorded timeline */
    double bubble_theory;        /* fill-drain's for the cells a stage runs: (K-1)/(M+K-1); V
                                  * cells per stage (interleaved, zbv): (K-1)/(V M+K-1) */
    double bubble_simulated;     /* the simulator's prediction for the measured per-cell times */
    double bubble_replayed;      /* the simulator replaying each action's measured duration: the
                                  * idle the schedule's dependencies alone give for those times */
    bool pinned;                 /* each stage thread ran on a core of its own */
} gp_pipeline_stats;
/* Stage k's busy fraction of the last step's span and the first layer of its cell. */
typedef struct gp_stage_stats {
    double busy_fraction;
    int first_layer;
    gp_remat remat; /* the cell's own: CELL or NONE */
} gp_stage_stats;
/* Fails when no step has run or the last one failed. stages (may be NULL) gets K entries. */
gp_status gp_pipeline_last_stats(const gp_pipeline *p, gp_pipeline_stats *out,
                                 gp_stage_stats *stages);
/* Chrome trace JSON / SVG timeline of the last step; errors name the path. */
gp_status gp_pipeline_write_trace(const gp_pipeline *p, const char *path);
gp_status gp_pipeline_write_timeline(const gp_pipeline *p, const char *path);

/* ----------------------------------------------------------- MPI launcher */

/* With launcher GP_LAUNCHER_MPI, gp_pipeline_new is called by every rank of an MPI job of
 * D x K ranks (D = data_parallel replicas, K = stages; any other size is an error naming
 * both, before anything is allocated). World rank r runs stage r % K of replica r / K;
 * every rank passes the same GLOBAL mini-batch to gp_pipeline_step and replica d trains on
 * its d-th slice of it (the batch must divide by D x M). Each stage's gradients are summed
 * over its D replicas in buckets (D = 2: one exchange of the partial sums; D > 2:
 * MPI_Iallreduce; on GPU ranks NCCL may do either, see gp_gpu_comm), each started as soon as
 * its layers' backward of the last micro-batch is done, overlapping the rest of that backward. Loss, gradient norm and losses of all
 * replicas meet in one fixed-order all-reduce, so every rank gets the same bits. D = 1 gives
 * bit-identical parameters to GP_LAUNCHER_THREADS; D > 1 differs from D = 1 by the order of
 * the gradient sums only (about 1e-7 relative). Every wait is bounded by comm_timeout_s: a
 * rank that fails or stops answering makes the others fail with a message naming the rank,
 * the action it waited on and the peer. A rank holds its own stage's layers and nothing more:
 * the other stages' layers are left uninitialized on it (evaluation, sampling and the parameter
 * hash run through the stages, see gp_pipeline_predict). */

/* Whether this library was built with MPI. */
bool gp_mpi_built(void);
/* Whether a launcher (mpirun, srun) started this process, from its environment; *world_size
 * (may be NULL) gets the number of ranks it announced (1 if none). MPI is not touched. */
bool gp_mpi_launched(int *world_size);
/* Initializes MPI once (MPI_THREAD_FUNNELED) and returns this process's world rank and size;
 * GP_UNSUPPORTED without MPI. gp_pipeline_new calls it itself. */
gp_status gp_mpi_init(int *rank, int *size);
/* At the end of the program, after every pipeline is freed: MPI_Finalize, or, if a run
 * failed (peers may be dead or waiting), MPI_Abort. Nothing without MPI. */
void gp_mpi_finalize(void);

/* This process's place: world rank and size (0 and 1 on threads), the stage it runs (-1: all
 * K, on threads) and its replica. Any pointer may be NULL. */
void gp_pipeline_place(const gp_pipeline *p, int *rank, int *nranks, int *stage, int *replica);
/* This process's tensor-parallel shard (-1: all T, on threads). The MPI mesh: world rank
 * r = (d K + k) T + t runs shard t of stage k of replica d. */
int gp_pipeline_shard(const gp_pipeline *p);
/* Collective over every rank: gathers the last step's timeline of every rank (track r = world
 * rank r = stage r % K of replica r / K; on one host on a common clock, across hosts each track
 * from its own step start) and every rank's stage memory counters, so that on every rank
 * gp_pipeline_last_stats (bubble over all tracks, simulated from replica 0's), write_trace,
 * write_timeline and gp_pipeline_mem_stats of any stage (replica 0's) work. A transport call
 * over MPI is drawn as WAIT: its blocking and its transfer cannot be told apart. Nothing to
 * do on threads. */
gp_status gp_pipeline_gather(gp_pipeline *p);
/* Collective over every rank: each rank's nbytes at mine into all (nbytes x the number of
 * ranks, world order), on every rank, bounded by the comm timeout (e.g. per-rank figures for a
 * report). On threads all gets this process's bytes once. */
gp_status gp_pipeline_allgather(gp_pipeline *p, const void *mine, size_t nbytes, void *all);
/* Bytes each world rank handed to MPI in the last step: point-to-point (activations and
 * gradients with their headers) and gradients given to the data-parallel all-reduce. Fills
 * n entries of each array (n >= the number of ranks); zeros on threads. */
gp_status gp_pipeline_bytes_sent(const gp_pipeline *p, uint64_t *p2p, uint64_t *allreduce, int n);
/* What the ranks of an MPI pipeline on CUDA devices use between them (NCCL or MPI; MPI on
 * threads and on CPU devices) and, where that is MPI on GPUs, why (e.g. "ranks 0 and 1 share
 * GPU ..."), else "": *why stays valid as long as the pipeline. */
gp_gpu_comm gp_pipeline_gpu_comm(const gp_pipeline *p, const char **why);
/* Bytes each device gave to its tensor axis's collectives in the last step (the shard layers'
 * all-reduces and the split cross-entropy's), in mesh order: under MPI world rank r's, on threads
 * stage k's shard t at k T + t (D = 1). Fills n entries (n >= the devices); zeros with T = 1. */
gp_status gp_pipeline_bytes_tensor(const gp_pipeline *p, uint64_t *tensor, int n);
/* ------------------------------------------------------------ safetensors */

/* A safetensors file (the format of the Python `safetensors` package, which
 * PyTorch tooling reads and writes): an 8-byte little-endian header length,
 * a JSON header naming each tensor's dtype, shape and byte range, a
 * "__metadata__" map of strings, then the raw little-endian data. Only F32
 * and I32 tensors of at most GP_MAX_DIMS dimensions are supported. */
typedef struct gp_safetensors gp_safetensors;
typedef struct gp_st_entry {
    const char *name;
    gp_dtype dtype;
    gp_shape shape;
    uint64_t begin, end; /* byte range in the data section */
} gp_st_entry;

/* Opens a file and validates its header, reading no tensor data: a regular
 * file (a FIFO or device is refused, never waited on), the header length
 * against the file size before the header is read, well-formed JSON of at
 * most 100 MiB, known dtypes, shapes that match the byte ranges, ranges that
 * tile the data section without gaps or overlaps, unique names, string
 * metadata, and well-formed checksums of tensors it holds ("crc32:<name>": 8
 * hex digits). Tensor bytes are read by gp_safetensors_get, which checks
 * each against its CRC-32. Every error names the file, the tensor or byte
 * offset, and what was expected. The file stays open until
 * gp_safetensors_free, which the caller calls on *out. */
gp_status gp_safetensors_read(const char *path, gp_safetensors **out);
/* The same checks on bytes in memory (copied), and every CRC-32 at once;
 * origin names them in errors. */
gp_status gp_safetensors_parse(const void *bytes, size_t nbytes, const char *origin,
                               gp_safetensors **out);
void gp_safetensors_free(gp_safetensors *f);
const char *gp_safetensors_origin(const gp_safetensors *f);
int gp_safetensors_count(const gp_safetensors *f);
/* Entries sorted by name; NULL outside 0..count-1 / when absent. */
const gp_st_entry *gp_safetensors_entry(const gp_safetensors *f, int i);
const gp_st_entry *gp_safetensors_find(const gp_safetensors *f, const char *name);
/* A metadata value, or NULL; valid until gp_safetensors_free. */
const char *gp_safetensors_meta(const gp_safetensors *f, const char *key);
/* Copies tensor `name` into dst (host memory of its size), after checking
 * that it exists, has `dtype` and (shape not NULL) that shape; then checks the
 * bytes copied against the tensor's CRC-32 from the metadata, if it has one
 * (on a mismatch dst holds the bytes read and the call fails). */
gp_status gp_safetensors_get(const gp_safetensors *f, const char *name, gp_dtype dtype,
                             const gp_shape *shape, void *dst);

/* Writes a safetensors file: tensors are borrowed until the write, which goes
 * through gp_file_out (complete under its name or absent) and adds the CRC-32
 * of every tensor to the metadata. */
typedef struct gp_safetensors_writer gp_safetensors_writer;
gp_status gp_safetensors_writer_new(gp_safetensors_writer **out);
void gp_safetensors_writer_free(gp_safetensors_writer *w);
gp_status gp_safetensors_writer_add(gp_safetensors_writer *w, const char *name, gp_dtype dtype,
                                    gp_shape shape, const void *data);
/* Sets (or replaces) a metadata string; keys starting "crc32:" are reserved. */
gp_status gp_safetensors_writer_meta(gp_safetensors_writer *w, const char *key,
                                     const char *value);
gp_status gp_safetensors_writer_write(const gp_safetensors_writer *w, const char *path);

/* ------------------------------------------------------------ GPT-2 files */

/* Hugging Face's GPT2LMHeadModel: a folder with config.json (a GPT2Config) and model.safetensors
 * (float32; names with or without "transformer."; Conv1D weights (in, out); lm_head.weight, if
 * present, is wte and ignored). docs/GPT2.md has the mapping. */
/* The gpt2 family config of a config.json: vocab_size padded to a multiple of 64, n_positions as
 * seq_len and max_len, no dropout. Options gpipe does not compute (an activation other than
 * gelu_new, layer_norm_epsilon other than 1e-5, scale_attn_by_inverse_layer_idx, unscaled
 * attention, cross-attention, untied embeddings) are GP_UNSUPPORTED naming the file and key. */
gp_status gp_hf_gpt2_config(const char *config_path, gp_transformer_config *out);
/* Reads dir/config.json and dir/model.safetensors and writes out_path: a parameters-only file
 * under gpipe's names (gp_checkpoint_load with no optimizer loads it; the padding rows of the
 * table are zero) with the gpt2 config in its "model_config" metadata; *cfg gets the config. A
 * missing or extra tensor or a wrong shape is an error naming the file and the tensor. */
gp_status gp_hf_gpt2_import(const char *dir, const char *out_path, gp_transformer_config *cfg);
/* Writes dir/model.safetensors and dir/config.json (atomically each) from an initialized model
 * built from c (tied embeddings), for GPT2LMHeadModel.from_pretrained(dir): the first vocab rows
 * of the table, weights transposed to Conv1D's layout. */
gp_status gp_hf_gpt2_export(gp_model *m, const gp_transformer_config *c, const char *dir);

/* ------------------------------------------------------------ checkpoints */

/* A checkpoint is a safetensors file holding every parameter and buffer as
 * "layers.<i>.<name>" (gp_model_param's names: "layers.3.attn.qkv.weight"),
 * the optimizer state beside it ("<param>.adam_m" and ".adam_v" for AdamW,
 * "<param>.momentum" for SGD with momentum), and in the metadata: "format"
 * ("gpipe.checkpoint"), "format_version", "step", "seed" (the init and dropout
 * key), "layer_kinds", "layers" (the range saved: "first-last"), "optimizer"
 * (its options as JSON), the caller's extra strings (e.g. the model config,
 * training options and data-order position) and a CRC-32 per tensor. The
 * layout is independent of how layers are split into stages, so a checkpoint
 * saved by a pipeline of K stages resumes on any other K. */
typedef struct gp_checkpoint_kv {
    const char *key, *value;
} gp_checkpoint_kv;

/* Saves layers [first, last) of m (first = 0, last = nlayers: the whole
 * model; a multi-process pipeline saves one part per stage) with the state of
 * optimizer o (NULL: parameters only) after `step` steps, atomically to path.
 * The parameters may live on several devices (a pipeline's stages, between
 * steps). */
gp_status gp_checkpoint_save(const char *path, gp_model *m, int first, int last,
                             const gp_optim_opts *o, int step, const gp_checkpoint_kv *extra,
                             int nextra);
/* Loads a read file into m's initialized parameters and, with o given, the
 * optimizer state (the trainer's or pipeline's, already allocated). Every
 * tensor is checked before anything is copied: the layer kinds, every name,
 * dtype and shape, the optimizer kind, and no tensor the model lacks; on any
 * mismatch m is left unchanged and the error names the file, the tensor and
 * what was expected. With o NULL the file may also be a foreign one (e.g.
 * exported from PyTorch) that holds exactly the parameters under these names. */
gp_status gp_checkpoint_load(const gp_safetensors *f, gp_model *m, const gp_optim_opts *o);
/* The "step" of a gpipe checkpoint (steps done when it was saved). */
gp_status gp_checkpoint_step(const gp_safetensors *f, int *step);

/* A checkpoint to load from, in either form: one safetensors file as above (or a foreign
 * weights file), or a multi-part set, as a multi-process pipeline saves it
 * (gp_pipeline_checkpoint_save): part files, each a checkpoint of a layer range (one stage's),
 * committed by an index "<base>.safetensors.index.json" (a path ending ".json" is opened as an
 * index). The index is JSON: "metadata" (the strings a one-file checkpoint carries, "layers"
 * covering the whole model), "parts" ([{"file", "layers": [first, last), "bytes", "crc32"}],
 * files in the index's folder, in layer order without gaps) and "weight_map" (tensor name ->
 * file, the layout of sharded safetensors checkpoints in PyTorch tooling). It is written only
 * after every part is durable, so a set without it is incomplete and never opened. Opening
 * reads the index (or the one file's header); tensor data and parts are read when their layers
 * are loaded. */
typedef struct gp_checkpoint gp_checkpoint;
gp_status gp_checkpoint_open(const char *path, gp_checkpoint **out);
void gp_checkpoint_close(gp_checkpoint *c);
/* 1 for the one-file form; the number of parts of a set. */
int gp_checkpoint_nparts(const gp_checkpoint *c);
/* A metadata string (the one file's or the index's), or NULL; valid until the close. */
const char *gp_checkpoint_meta(const gp_checkpoint *c, const char *key);
/* Its "step" (steps done when it was saved). */
gp_status gp_checkpoint_saved_step(const gp_checkpoint *c, int *step);
/* Loads layers [first, last) of m (and with o their optimizer state) from whichever parts hold
 * them, as gp_checkpoint_load does: each part read is checked against the index (size, CRC-32
 * of the whole file, its layers and step) and against the model before anything is copied, so
 * on any error m is unchanged and the message names the part file. Layers outside the range
 * need not be allocated. */
gp_status gp_checkpoint_load_layers(gp_checkpoint *c, gp_model *m, int first, int last,
                                    const gp_optim_opts *o);
/* Checks that c can load into m before m is initialized (or anything of it allocated), from
 * the tensors' names, dtypes and shapes against the layers' declared parameter shapes: its layer
 * kinds (a gpipe checkpoint), every tensor one of m's parameters (or an optimizer state beside
 * one) with dtype F32 and the parameter's shape, every parameter of m present, the parts of a
 * set covering m's layers. Reads only headers (a set: the index and each part's header, whose
 * file must have the size the index committed), no tensor data, so a checkpoint of another
 * model, however large its model_config, is refused in milliseconds; an error names the file,
 * the tensor and both shapes. The data (CRC-32s) is checked by gp_checkpoint_load_layers. */
gp_status gp_checkpoint_check_model(gp_checkpoint *c, const gp_model *m);
/* The path of part i (0 <= i < gp_checkpoint_nparts): a set's part file, or the one file
 * itself; NULL outside the range. Valid until the close. */
const char *gp_checkpoint_part_path(const gp_checkpoint *c, int i);
/* One part of a set, for the index: its file name (in the index's folder), the layers it
 * holds, and its size and CRC-32 (gp_checkpoint_file_info). */
typedef struct gp_checkpoint_part {
    const char *file;
    int first, last;
    uint64_t bytes;
    uint32_t crc32;
} gp_checkpoint_part;
gp_status gp_checkpoint_file_info(const char *path, uint64_t *bytes, uint32_t *crc32);
/* Commits a set: writes its index atomically (gp_file_out) with the metadata
 * gp_checkpoint_save would give the whole model. Call it only once every part is durable. */
gp_status gp_checkpoint_commit(const char *index_path, const gp_model *m,
                               const gp_checkpoint_part *parts, int nparts,
                               const gp_optim_opts *o, int step, const gp_checkpoint_kv *extra,
                               int nextra);

/* A pipeline's checkpoint, collective over every rank. Threads: one file,
 * "<base>.safetensors". MPI: the rank of each stage in replica 0 writes that stage's layers with
 * their optimizer state as "<base>-<k+1, 5 digits>-of-<K, 5 digits>.safetensors" (atomically);
 * then every rank learns every part's outcome (an all-gather bounded by the comm timeout), and
 * only if all K are durable does rank 0 write the index "<base>.safetensors.index.json". A part
 * that fails on any rank: no index, the parts written are removed, and every rank returns the
 * same error naming the failed rank, stage and cause; likewise if the index cannot be written.
 * written (may be NULL) gets the path of the file or index. */
gp_status gp_pipeline_checkpoint_save(gp_pipeline *p, const char *base, int step,
                                      const gp_checkpoint_kv *extra, int nextra, char *written,
                                      size_t written_size);
/* The same checkpoint written in the background, for saves every step. Collective like
 * gp_pipeline_checkpoint_save, whose files it writes byte for byte: each process copies its
 * parts' tensors (parameters, buffers, optimizer state) into host memory it keeps for the next
 * save, and returns; a thread of the process writes them while training goes on. At most one
 * save is in flight: begin again only after gp_pipeline_checkpoint_finish has reported it
 * (else GP_INVALID_ARGUMENT). A failure to copy is every rank's error here; a failure to write
 * (disk full, folder unwritable) is the finish's. */
gp_status gp_pipeline_checkpoint_begin(gp_pipeline *p, const char *base, int step,
                                       const gp_checkpoint_kv *extra, int nextra);
/* begin with background false: written on the caller's thread before it returns, from the
 * model's own memory (no copy); then gp_pipeline_checkpoint_finish reports it. */
gp_status gp_pipeline_checkpoint_start(gp_pipeline *p, const char *base, int step,
                                       const gp_checkpoint_kv *extra, int nextra,
                                       bool background);
typedef struct gp_checkpoint_saved {
    int step;        /* the step of the save finished; -1: none was in flight */
    bool pending;    /* still being written somewhere (finish called without wait) */
    double waited_s; /* the seconds this call waited for the writes */
    double write_s;  /* the seconds the writes took, in the background */
    uint64_t bytes;  /* this process's part files (sets only) */
    char path[4096]; /* the file, or the set's index, once committed */
} gp_checkpoint_saved;
/* Finishes the save in flight, collective over every rank (they began it together, so they
 * agree whether there is one). wait: blocks until this process's writes are done; else, while
 * any rank is still writing, returns GP_OK with pending set and nothing else done. Once every
 * part is written: under MPI every rank learns every part's outcome and, only if all are
 * durable, rank 0 commits the set's index, as gp_pipeline_checkpoint_save does. A write that
 * failed is returned here, the same error on every rank, naming the file (a set's parts
 * written are removed). gp_pipeline_free waits for a save in flight, and commits nothing. */
gp_status gp_pipeline_checkpoint_finish(gp_pipeline *p, bool wait, gp_checkpoint_saved *out);
/* Collective: each rank loads its own stage's layers and their optimizer state from c (any
 * form, saved with any K; on threads every layer), and every rank returns the same outcome (a
 * failure names the rank and the part). Replicas load the same values. The other stages'
 * layers are not loaded on a rank (it holds none). Sets no step count. */
gp_status gp_pipeline_checkpoint_load(gp_pipeline *p, gp_checkpoint *c);

#ifdef __cplusplus
}
#endif
#endif /* GPIPE_H */
