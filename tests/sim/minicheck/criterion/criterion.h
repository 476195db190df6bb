/* Stands in for Criterion's header in ThreadSanitizer builds (this directory comes first on the include path
 * there): suites written for Criterion run on sim_minicheck unchanged. Criterion's header brings these in too. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_minicheck.h"
