/* A collective group as the layers see it: this member's place in a group of `size` devices that
 * split a layer's model dimensions (one mesh axis, the tensor axis), and the group's float
 * collectives. The layers (below comm) call it without knowing how it is carried: the pipeline
 * builds one from a transport of comm/ (threads, MPI; NCCL would fit the same shape: device
 * buffers, one op per call, every member calling in the same order). Header only. */
#ifndef GP_CORE_COLLECTIVE_H
#define GP_CORE_COLLECTIVE_H

#include <stdint.h>

#include "gpipe.h"

/* How an all-reduce combines the members' values. */
typedef enum gp_reduce_op {
    GP_REDUCE_SUM = 0, /* added in member order 0, 1, ..., size - 1, starting from member 0's */
    GP_REDUCE_MAX = 1  /* exact in any order */
} gp_reduce_op;

typedef struct gp_coll_group {
    int rank, size; /* this member, 0 <= rank < size */
    /* In place: x (n floats in memory the group can reach, on dev) becomes the reduction over
     * the members, element by element, the same bits on every member and every run. */
    gp_status (*allreduce)(void *ctx, gp_device *dev, float *x, int64_t n, gp_reduce_op op);
    /* out (size * n floats) = member 0's n floats of x, then member 1's, ... on every member. */
    gp_status (*allgather)(void *ctx, gp_device *dev, const float *x, int64_t n, float *out);
    void *ctx;
} gp_coll_group;

#endif
