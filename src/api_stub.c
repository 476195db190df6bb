#include "gpureclaim.h"
const char *gpureclaim_version(void) { return GPURECLAIM_VERSION_STRING; }
