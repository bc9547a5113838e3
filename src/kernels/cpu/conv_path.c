/* One switch for the convolution paths, so each path asks the same question the same way. */
#include "kernels/cpu/conv_path.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static bool g_enabled[GP_CONV_PATHS] = {true, true};
static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;

static void read_env(void) {
    const char *v = getenv("GP_CPU_CONV");
    if (!v) return;
    if (strcmp(v, "direct") == 0 || strcmp(v, "im2col") == 0) g_enabled[GP_CONV_WINOGRAD] = false;
    if (strcmp(v, "im2col") == 0) g_enabled[GP_CONV_DIRECT] = false;
}

bool gp_conv_path_on(gp_conv_path p) {
    pthread_once(&g_env_once, read_env);
    return g_enabled[p];
}

bool gp_conv_path_enable(gp_conv_path p, bool on) {
    pthread_once(&g_env_once, read_env);
    const bool was = g_enabled[p];
    g_enabled[p] = on;
    return was;
}
