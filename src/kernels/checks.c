/* The checks every device's ops make of ids, labels, vocabulary shards and the loss normalizer
 * before writing anything, with one message each, so that the table's contract (an error naming
 * the position, nothing written) reads the same on every device. Host memory: a GPU's ops check
 * host copies. */
#include "core/error.h"
#include "kernels/checks.h"

gp_status gp_kernels_check_ids(int64_t n, int64_t row_len, int64_t vocab, const int32_t *ids) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return gp_error(GP_INVALID_ARGUMENT,
                            "token id %d at position %lld (row %lld, column %lld) is out of "
                            "range: expected 0 <= id < vocab = %lld",
                            (int)ids[i], (long long)i, (long long)(i / row_len),
                            (long long)(i % row_len), (long long)vocab);
    return GP_OK;
}

gp_status gp_kernels_check_labels(int64_t rows, int64_t classes, const int32_t *labels,
                               int64_t *counted) {
    int64_t n = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (labels[r] < -1 || labels[r] >= classes)
            return gp_error(GP_INVALID_ARGUMENT,
                            "label %d at row %lld is outside [-1, %lld) (-1: ignored)",
                            (int)labels[r], (long long)r, (long long)classes);
        n += labels[r] != -1;
    }
    if (counted) *counted = n;
    return GP_OK;
}

gp_status gp_kernels_check_shard(int64_t vocab, int64_t first, int64_t rows, const char *what) {
    if (first < 0 || rows < 1 || first + rows > vocab)
        return gp_error(GP_INVALID_ARGUMENT,
                        "%s shard [%lld, %lld) is not within [0, %lld) or is empty", what,
                        (long long)first, (long long)(first + rows), (long long)vocab);
    return GP_OK;
}

gp_status gp_kernels_check_smoothing(double smoothing) {
    if (!(smoothing >= 0 && smoothing < 1))
        return gp_error(GP_INVALID_ARGUMENT, "label smoothing %g, expected in [0, 1)", smoothing);
    return GP_OK;
}

gp_status gp_kernels_check_bf16_operand(const char *op, const char *device, bool bf16,
                                        bool given) {
    if (given && !bf16)
        return gp_error(GP_INVALID_ARGUMENT,
                        "%s: a bf16 operand on device %s, whose precision is fp32 (bf16 "
                        "operands are for a bf16 device's products)",
                        op, device);
    return GP_OK;
}

gp_status gp_kernels_check_normalizer(double normalizer, int64_t counted) {
    if (counted > 0 && !(normalizer > 0))
        return gp_error(GP_INVALID_ARGUMENT,
                        "normalizer %g with %lld labelled rows, expected > 0 (the mini-batch's "
                        "count of non-ignored labels)",
                        normalizer, (long long)counted);
    return GP_OK;
}
