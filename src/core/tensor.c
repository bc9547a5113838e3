/* Shapes and tensors: row-major, up to four dimensions, memory from a device (or a host view).
 * Bytes move only through the devices' copy and fill: a tensor may live where the host cannot
 * reach. */
#include "core/tensor.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/device.h"
#include "core/error.h"

gp_shape gp_shape1(int64_t a) { return (gp_shape){1, {a, 0, 0, 0}}; }
gp_shape gp_shape2(int64_t a, int64_t b) { return (gp_shape){2, {a, b, 0, 0}}; }
gp_shape gp_shape3(int64_t a, int64_t b, int64_t c) { return (gp_shape){3, {a, b, c, 0}}; }
gp_shape gp_shape4(int64_t a, int64_t b, int64_t c, int64_t d) {
    return (gp_shape){4, {a, b, c, d}};
}

int64_t gp_shape_nelem(const gp_shape *s) {
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->dim[i];
    return n;
}

bool gp_shape_equal(const gp_shape *a, const gp_shape *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->dim[i] != b->dim[i]) return false;
    return true;
}

char *gp_shape_str(const gp_shape *s, char *buf, size_t nbytes) {
    size_t used = 0;
    if (!nbytes) return buf;
    buf[0] = '\0';
    used += (size_t)snprintf(buf, nbytes, "(");
    for (int i = 0; i < s->ndim && used < nbytes; i++)
        used += (size_t)snprintf(buf + used, nbytes - used, "%s%" PRId64, i ? ", " : "", s->dim[i]);
    if (used < nbytes) snprintf(buf + used, nbytes - used, ")");
    return buf;
}

size_t gp_dtype_nbytes(gp_dtype t) { return t == GP_BF16 ? 2 : 4; }
const char *gp_dtype_name(gp_dtype t) {
    return t == GP_I32 ? "int32" : t == GP_BF16 ? "bfloat16" : "float32";
}

int64_t gp_tensor_nelem(const gp_tensor *t) { return gp_shape_nelem(&t->shape); }
size_t gp_tensor_nbytes(const gp_tensor *t) {
    return (size_t)gp_tensor_nelem(t) * gp_dtype_nbytes(t->dtype);
}

void *gp_ptr_offset(void *data, int64_t nelem, gp_dtype dtype) {
    return (char *)data + (size_t)nelem * gp_dtype_nbytes(dtype);
}

static gp_status check_shape(gp_shape shape) {
    char buf[96];
    if (shape.ndim < 0 || shape.ndim > GP_MAX_DIMS)
        return gp_error(GP_SHAPE, "tensor with %d dimensions: expected 0 to %d", shape.ndim,
                        GP_MAX_DIMS);
    int64_t n = 1;
    for (int i = 0; i < shape.ndim; i++) {
        if (shape.dim[i] < 0 || (shape.dim[i] && n > INT64_MAX / 4 / shape.dim[i]))
            return gp_error(GP_SHAPE, "tensor shape %s: dimensions must be >= 0 and fit in memory",
                            gp_shape_str(&shape, buf, sizeof buf));
        n *= shape.dim[i];
    }
    return GP_OK;
}

gp_status gp_tensor_alloc(gp_device *dev, gp_mem_category cat, gp_shape shape, gp_dtype dtype,
                          gp_tensor *out) {
    if (!out) return gp_error(GP_INVALID_ARGUMENT, "gp_tensor_alloc: out is NULL");
    memset(out, 0, sizeof *out);
    GP_TRY(check_shape(shape));
    if (dtype != GP_F32 && dtype != GP_I32 && dtype != GP_BF16)
        return gp_error(GP_INVALID_ARGUMENT, "gp_tensor_alloc: unknown dtype %d", (int)dtype);
    size_t nbytes = (size_t)gp_shape_nelem(&shape) * gp_dtype_nbytes(dtype);
    gp_status s;
    void *p = gp_device_alloc(dev, cat, nbytes, &s);
    if (!p) return s;
    *out = (gp_tensor){.data = p, .shape = shape, .dtype = dtype, .dev = dev, .cat = cat,
                       .owned = true};
    return GP_OK;
}

gp_status gp_tensor_zeros(gp_device *dev, gp_mem_category cat, gp_shape shape, gp_dtype dtype,
                          gp_tensor *out) {
    GP_TRY(gp_tensor_alloc(dev, cat, shape, dtype, out));
    gp_status s = gp_tensor_fill_zero(out);
    if (s != GP_OK) gp_tensor_release(out);
    return s;
}

void gp_tensor_release(gp_tensor *t) {
    if (!t) return;
    if (t->owned && t->data) gp_device_release(t->dev, t->data);
    memset(t, 0, sizeof *t);
}

gp_tensor gp_tensor_view_on(gp_device *dev, void *data, gp_shape shape, gp_dtype dtype,
                            gp_mem_category cat) {
    return (gp_tensor){.data = data, .shape = shape, .dtype = dtype, .dev = dev, .cat = cat,
                       .owned = false};
}

gp_tensor gp_tensor_view(void *data, gp_shape shape, gp_dtype dtype) {
    return gp_tensor_view_on(NULL, data, shape, dtype, GP_MEM_WORKSPACE);
}

gp_tensor gp_tensor_rows(const gp_tensor *t, int64_t first, int64_t n) {
    const int64_t rows = t->shape.ndim ? t->shape.dim[0] : 0;
    const int64_t row = rows ? gp_tensor_nelem(t) / rows : 0;
    gp_shape s = t->shape;
    s.dim[0] = n;
    return gp_tensor_view_on(t->dev, gp_ptr_offset(t->data, first * row, t->dtype), s, t->dtype,
                             t->cat);
}

void *gp_tensor_host_data(const gp_tensor *t) {
    return t && gp_device_is_host(t->dev) ? t->data : NULL;
}

gp_status gp_tensor_fill_zero(gp_tensor *t) {
    if (!t) return gp_error(GP_INVALID_ARGUMENT, "gp_tensor_fill_zero: tensor is NULL");
    size_t n = gp_tensor_nbytes(t);
    if (!n) return GP_OK;
    if (!t->data) return gp_error(GP_INVALID_ARGUMENT, "gp_tensor_fill_zero: no data");
    if (!t->dev) {
        memset(t->data, 0, n); /* a host view */
        return GP_OK;
    }
    return gp_device_fill(t->dev, t->data, n, 0);
}

/* Host memory to t (nbytes = its size), or t to host memory. */
static gp_status host_copy(gp_tensor *t, void *host, size_t nbytes, bool to_host) {
    if (!t->dev) {
        if (to_host)
            memcpy(host, t->data, nbytes);
        else
            memcpy(t->data, host, nbytes);
        return GP_OK;
    }
    return to_host ? gp_device_copy(t->dev, host, t->data, nbytes, GP_COPY_DEVICE_TO_HOST)
                   : gp_device_copy(t->dev, t->data, host, nbytes, GP_COPY_HOST_TO_DEVICE);
}

static gp_status check_host_copy(const gp_tensor *t, const void *host, size_t nbytes,
                                 const char *fn) {
    if (!t || !host) return gp_error(GP_INVALID_ARGUMENT, "%s: NULL argument", fn);
    if (nbytes != gp_tensor_nbytes(t))
        return gp_error(GP_INVALID_ARGUMENT, "%s: %zu bytes, the tensor holds %zu", fn, nbytes,
                        gp_tensor_nbytes(t));
    if (nbytes && !t->data) return gp_error(GP_INVALID_ARGUMENT, "%s: the tensor has no data", fn);
    return GP_OK;
}

gp_status gp_tensor_to_host(const gp_tensor *t, void *dst, size_t nbytes) {
    GP_TRY(check_host_copy(t, dst, nbytes, "gp_tensor_to_host"));
    return nbytes ? host_copy((gp_tensor *)t, dst, nbytes, true) : GP_OK;
}

gp_status gp_tensor_from_host(gp_tensor *t, const void *src, size_t nbytes) {
    GP_TRY(check_host_copy(t, src, nbytes, "gp_tensor_from_host"));
    return nbytes ? host_copy(t, (void *)src, nbytes, false) : GP_OK;
}

gp_status gp_tensor_copy(gp_tensor *dst, const gp_tensor *src) {
    char a[96], b[96];
    if (!dst || !src) return gp_error(GP_INVALID_ARGUMENT, "gp_tensor_copy: NULL argument");
    const size_t n = gp_tensor_nbytes(src);
    if (dst->dtype != src->dtype || gp_tensor_nbytes(dst) != n)
        return gp_error(GP_SHAPE, "gp_tensor_copy: source %s %s into destination %s %s: expected "
                                  "the same dtype and number of elements",
                        gp_dtype_name(src->dtype), gp_shape_str(&src->shape, a, sizeof a),
                        gp_dtype_name(dst->dtype), gp_shape_str(&dst->shape, b, sizeof b));
    if (!n || dst->data == src->data) return GP_OK;
    if (!dst->data || !src->data)
        return gp_error(GP_INVALID_ARGUMENT, "gp_tensor_copy: a tensor without data");
    if (dst->dev == src->dev && dst->dev)
        return gp_device_copy(dst->dev, dst->data, src->data, n, GP_COPY_DEVICE_TO_DEVICE);
    if (gp_device_is_host(src->dev)) return host_copy(dst, src->data, n, false);
    if (gp_device_is_host(dst->dev)) return host_copy((gp_tensor *)src, dst->data, n, true);
    /* Two devices the host cannot reach directly: between them where their kind can (GPUs),
     * else through host memory. */
    bool direct = false;
    GP_TRY(gp_device_copy_peer(dst->dev, dst->data, src->dev, src->data, n, &direct));
    if (direct) return GP_OK;
    void *stage = malloc(n);
    if (!stage)
        return gp_error(GP_OUT_OF_MEMORY, "gp_tensor_copy: %zu bytes of host staging from %s to %s",
                        n, gp_device_name(src->dev), gp_device_name(dst->dev));
    gp_status s = host_copy((gp_tensor *)src, stage, n, true);
    if (s == GP_OK) s = host_copy(dst, stage, n, false);
    free(stage);
    return s;
}
