/* The model part's whole interface for the parts above it (model_internal.h), under the name
 * their files include it by; a store's flat blocks themselves are declared in store.h. */
#ifndef GP_MODEL_PARAM_STORE_H
#define GP_MODEL_PARAM_STORE_H

#include "model/model_internal.h"

#endif
