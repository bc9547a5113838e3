/* The checks of ids, labels, vocabulary shards, the loss normalizer and bf16 operands that every
 * device's ops make before writing anything (checks.c), one message each. */
#ifndef GP_KERNELS_CHECKS_H
#define GP_KERNELS_CHECKS_H

#include <stdbool.h>
#include <stdint.h>

#include "gpipe.h"

/* The checks of the ops that read ids or labels, before they write anything (host
 * arrays): every id in [0, vocab) (named by position, row and column); every label in [-1,
 * classes) (-1: ignored; *counted, may be NULL, gets the others); a vocabulary shard
 * [first, first + rows) within [0, vocab) and not empty (`what` names it); the normalizer > 0
 * where any row is labelled. */
gp_status gp_kernels_check_ids(int64_t n, int64_t row_len, int64_t vocab, const int32_t *ids);
gp_status gp_kernels_check_labels(int64_t rows, int64_t classes, const int32_t *labels,
                                  int64_t *counted);
gp_status gp_kernels_check_shard(int64_t vocab, int64_t first, int64_t rows, const char *what);
gp_status gp_kernels_check_normalizer(double normalizer, int64_t counted);
/* A label smoothing in [0, 1), or an error naming it. */
gp_status gp_kernels_check_smoothing(double smoothing);
/* An operand given in bf16 (kernel_ops.def: x16) to `op` of a device whose precision is fp32
 * (bf16 false) is refused, naming the device. */
gp_status gp_kernels_check_bf16_operand(const char *op, const char *device, bool bf16,
                                        bool given);

#endif
