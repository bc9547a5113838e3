/* The model part's interface, as the parts above it use it (the pipeline, the checkpoints): the
 * layout (model_types.h) and every file's header. The files of src/model include those headers
 * themselves, each only what it builds on, never this one. */
#ifndef GP_MODEL_INTERNAL_H
#define GP_MODEL_INTERNAL_H

#include "model/inference.h"
#include "model/model.h"
#include "model/model_types.h"
#include "model/sequence.h"
#include "model/shard.h"
#include "model/skips.h"
#include "model/store.h"
#include "model/ties.h"

#endif
