/* Shapes and tensors: row-major, up to four dimensions, memory from a device. */
#include <inttypes.h>
#include <string.h>

#include "device.h"
#include "error.h"

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

size_t gp_dtype_nbytes(gp_dtype t) { return t == GP_I32 ? 4 : 4; }
const char *gp_dtype_name(gp_dtype t) { return t == GP_I32 ? "int32" : "float32"; }

int64_t gp_tensor_nelem(const gp_tensor *t) { return gp_shape_nelem(&t->shape); }
size_t gp_tensor_nbytes(const gp_tensor *t) {
    return (size_t)gp_tensor_nelem(t) * gp_dtype_nbytes(t->dtype);
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
    if (dtype != GP_F32 && dtype != GP_I32)
        return gp_error(GP_INVALID_ARGUMENT, "gp_tensor_alloc: unknown dtype %d", (int)dtype);
    size_t nbytes = (size_t)gp_shape_nelem(&shape) * gp_dtype_nbytes(dtype);
    gp_status s;
    void *p = gp_device_alloc(dev, cat, nbytes ? nbytes : 1, &s);
    if (!p) return s;
    out->data = p;
    out->shape = shape;
    out->dtype = dtype;
    out->dev = dev;
    out->cat = cat;
    out->owned = true;
    return GP_OK;
}

gp_status gp_tensor_zeros(gp_device *dev, gp_mem_category cat, gp_shape shape, gp_dtype dtype,
                          gp_tensor *out) {
    GP_TRY(gp_tensor_alloc(dev, cat, shape, dtype, out));
    memset(out->data, 0, gp_tensor_nbytes(out));
    return GP_OK;
}

void gp_tensor_release(gp_tensor *t) {
    if (!t) return;
    if (t->owned && t->data) gp_device_release(t->dev, t->data);
    memset(t, 0, sizeof *t);
}

gp_tensor gp_tensor_view(void *data, gp_shape shape, gp_dtype dtype) {
    gp_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.shape = shape;
    t.dtype = dtype;
    t.cat = GP_MEM_WORKSPACE;
    t.owned = false;
    return t;
}
