/* Prints the public structs' sizes and a few offsets, for checking python/gpureclaim/'s ctypes mirrors; with
 * "names", the name lists of src/base/names.h and the option list of src/base/options.h, one line each, for
 * test_names_docs.py to check the Python tables, the GPU tests' shim and the documents against. */
#include "gpureclaim.h"
#include "names.h"
#include "options.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

static const char *str(const char *s) { return s ? s : "-"; }

/* option NAME DEFAULT RUN-OPTION HOW ("-": none; HOW: value, flag or optional). */
static void opt(const char *name, const char *def, const char *longopt, int how) {
  printf("option %s %s %s %s\n", name, def, longopt,
         how == GR_RUN_VALUE      ? "value"
         : how == GR_RUN_FLAG     ? "flag"
         : how == GR_RUN_OPTIONAL ? "optional"
                                  : "-");
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "names")) {
#define NAME_(value, name) printf("%s %d %s\n", list, (int)(value), name);
#define NAME3_(id, value, name) NAME_(value, name)
    const char *list = "kind";
    GR_KINDS(NAME_)
    list = "state";
    GR_BLOCK_STATES(NAME_)
    list = "trigger";
    GR_TRIGGERS(NAME_)
    list = "sleep_state";
    GR_SLEEP_STATES(NAME_)
    list = "what";
    GR_WHATS(NAME_)
    list = "what_alias";
    GR_WHAT_ALIASES(NAME_)
    list = "api";
    GR_APIS(NAME3_)
#define RUN_(shortopt, longopt, how, set, meta, help) str(longopt), how
#define OPT_(ID, field, kind, bound, def, expected, run) opt("GPURECLAIM_" #ID, str(def), RUN_ run);
    GR_OPTIONS(OPT_)
    return 0;
  }
  printf("stats %zu %zu\n", sizeof(gpureclaim_stats_t), offsetof(gpureclaim_stats_t, pools));
  printf("report %zu %zu %zu\n", sizeof(gpureclaim_report_t), offsetof(gpureclaim_report_t, ndevices),
         offsetof(gpureclaim_report_t, devices));
  printf("device_report %zu\n", sizeof(gpureclaim_device_report_t));
  printf("block %zu %zu\n", sizeof(gpureclaim_block_t), offsetof(gpureclaim_block_t, handle));
  return 0;
}
