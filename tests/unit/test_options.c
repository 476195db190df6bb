/* The option list of options.h as options.c reads it: the defaults (parsed from the list's default column, and
 * equal to what the library always used), each kind's parser at its bounds, the members a value sets, and the
 * warning a malformed value gets. tests/integration/test_option_values.c runs programs with such values. */
#include "names.h"
#include "options.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void unset_all(void) {
#define UNSET_(ID, ...) unsetenv("GPURECLAIM_" #ID);
  GR_OPTIONS(UNSET_)
#undef UNSET_
}

/* Reloads the options with name=value (NULL: every variable unset) and returns what the library wrote on
 * stderr meanwhile. */
static const char *reload_with(const char *name, const char *value) {
  static char err[4096];
  unset_all();
  if (name)
    setenv(name, value, 1);
  FILE *tmp = tmpfile();
  cr_assert_not_null(tmp);
  fflush(stderr);
  int saved = dup(2);
  dup2(fileno(tmp), 2);
  gr_opt_reload();
  dup2(saved, 2);
  close(saved);
  rewind(tmp);
  size_t n = fread(err, 1, sizeof err - 1, tmp);
  err[n] = '\0';
  fclose(tmp);
  return err;
}

Test(options, defaults_are_what_they_always_were) {
  cr_assert_str_empty(reload_with(NULL, NULL));
  const gr_options_t *o = gr_opt();
  cr_assert_eq(o->disable, false);
  cr_assert_eq(o->signal, SIGUSR1);
  cr_assert_eq(o->on_signal, GPURECLAIM_CACHED | GPURECLAIM_ORPHANED);
  cr_assert_eq(o->on_signal_sleep, false);
  cr_assert_eq(o->oom_retry, 1);
  cr_assert_str_empty(o->log);
  cr_assert_eq(o->log_stderr, false);
  cr_assert_eq(o->leak_report, false);
  cr_assert_eq(o->backtrace, false);
  cr_assert_eq(o->python, true);
  cr_assert_eq(o->status, true);
  cr_assert_eq(o->verbose, 0);
  cr_assert_eq(o->peers, GR_PEERS_ASK | GR_PEERS_GIVE);
  cr_assert_eq(o->peer_timeout_ms, 2000);
  cr_assert_eq(o->sleep, -1);
  cr_assert_eq(o->wake_timeout, 10);
  cr_assert_eq(o->sleep_idle, 0);
  cr_assert_eq(o->sleep_min_awake, 2);
  cr_assert_eq(o->wait, 30);
  cr_assert(o->guarantee.bytes == 0 && o->guarantee.ppm == 0, "no guarantee by default");
  cr_assert_eq(o->rundir[0], '/', "the run directory's default is computed: %s", o->rundir);
}

Test(options, every_default_is_a_value_its_parser_takes) {
#define DEF_(ID, field, kind, bound, def, ...) {"GPURECLAIM_" #ID, def},
  static const struct { const char *name, *def; } defs[] = {GR_OPTIONS(DEF_)};
#undef DEF_
  size_t n = 0;
  for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++) {
    const char *expected;
    if (!defs[i].def)
      continue;
    cr_assert_eq(gr_opt_check(defs[i].name, defs[i].def, &expected), 0, "%s's default %s", defs[i].name, defs[i].def);
    n++;
  }
  cr_assert_geq(n, 14);
}

/* gr_opt_check's verdict on value for variable name. */
static int check(const char *name, const char *value) {
  const char *expected;
  return gr_opt_check(name, value, &expected);
}

Test(options, whole_numbers_at_their_bounds) {
  static const struct {
    const char *name, *max, *over;
  } b[] = {{"GPURECLAIM_OOM_RETRY", "16", "17"},
           {"GPURECLAIM_VERBOSE", "2", "3"},
           {"GPURECLAIM_WAKE_TIMEOUT", "86400", "86401"},
           {"GPURECLAIM_SLEEP_IDLE", "2592000", "2592001"},
           {"GPURECLAIM_SLEEP_MIN_AWAKE", "86400", "86401"},
           {"GPURECLAIM_WAIT", "86400", "86401"}};
  for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
    cr_assert_eq(check(b[i].name, "0"), 0, "%s=0", b[i].name);
    cr_assert_eq(check(b[i].name, b[i].max), 0, "%s=%s", b[i].name, b[i].max);
    cr_assert_eq(check(b[i].name, b[i].over), -EINVAL, "%s=%s", b[i].name, b[i].over);
    cr_assert_eq(check(b[i].name, "-1"), -EINVAL);
    cr_assert_eq(check(b[i].name, ""), -EINVAL);
    cr_assert_eq(check(b[i].name, "1x"), -EINVAL);
    cr_assert_eq(check(b[i].name, " 1"), -EINVAL);
  }
  reload_with("GPURECLAIM_SLEEP_IDLE", "2592000");
  cr_assert_eq(gr_opt()->sleep_idle, 2592000);
  reload_with("GPURECLAIM_WAKE_TIMEOUT", "0");
  cr_assert_eq(gr_opt()->wake_timeout, 0);
  reload_with("GPURECLAIM_VERBOSE", "2");
  cr_assert_eq(gr_opt()->verbose, 2);
  reload_with("GPURECLAIM_WAIT", "0");
  cr_assert_eq(gr_opt()->wait, 0);
}

/* GPURECLAIM_GUARANTEE is written as GPURECLAIM_LIMIT is (gr_opt_parse_size, tested with the limit below): a
 * size or a fraction of the device; unset or malformed, none. */
Test(options, guarantee_sizes_and_fractions) {
  reload_with("GPURECLAIM_GUARANTEE", "3G");
  cr_assert_eq(gr_opt()->guarantee.bytes, 3ull << 30);
  cr_assert_str_empty(reload_with("GPURECLAIM_GUARANTEE", "256M"));
  cr_assert_eq(gr_opt()->guarantee.bytes, 256ull << 20);
  cr_assert_str_empty(reload_with("GPURECLAIM_GUARANTEE", "0.25"));
  cr_assert(gr_opt()->guarantee.bytes == 0 && gr_opt()->guarantee.ppm == 250000, "a quarter of the device");
  const char *warned = reload_with("GPURECLAIM_GUARANTEE", "lots");
  cr_assert(strstr(warned, "GPURECLAIM_GUARANTEE") && strstr(warned, "unset: no guarantee"), "%s", warned);
  cr_assert(gr_opt()->guarantee.bytes == 0 && gr_opt()->guarantee.ppm == 0, "malformed: none");
  reload_with(NULL, NULL);
}

Test(options, sleep_is_auto_or_a_yes_or_no) {
  static const struct {
    const char *v;
    int want;
  } ok[] = {{"auto", -1}, {"AUTO", -1}, {"1", 1}, {"yes", 1}, {"On", 1}, {"0", 0}, {"no", 0}, {"off", 0}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    cr_assert_str_empty(reload_with("GPURECLAIM_SLEEP", ok[i].v), "GPURECLAIM_SLEEP=%s", ok[i].v);
    cr_assert_eq(gr_opt()->sleep, ok[i].want, "GPURECLAIM_SLEEP=%s", ok[i].v);
  }
  cr_assert_eq(check("GPURECLAIM_SLEEP", "automatic"), -EINVAL);
  cr_assert_eq(check("GPURECLAIM_SLEEP", ""), -EINVAL);
}

Test(options, what_a_value_sets) {
  reload_with("GPURECLAIM_ON_SIGNAL", "sleep");
  cr_assert(gr_opt()->on_signal_sleep);
  cr_assert_eq(gr_opt()->on_signal, GPURECLAIM_CACHED | GPURECLAIM_ORPHANED, "the default kept");
  reload_with("GPURECLAIM_ON_SIGNAL", "ALL,orphans");
  cr_assert(!gr_opt()->on_signal_sleep);
  cr_assert_eq(gr_opt()->on_signal, GPURECLAIM_ALL | GPURECLAIM_ORPHANED);
  reload_with("GPURECLAIM_LOG", "stderr");
  cr_assert(gr_opt()->log_stderr);
  cr_assert_str_empty(gr_opt()->log);
  reload_with("GPURECLAIM_LOG", "/tmp/x.log");
  cr_assert(!gr_opt()->log_stderr);
  cr_assert_str_eq(gr_opt()->log, "/tmp/x.log");
  reload_with("GPURECLAIM_PEERS", "sleep,ask");
  cr_assert_eq(gr_opt()->peers, GR_PEERS_ASK | GR_PEERS_SLEEP);
  reload_with("GPURECLAIM_PEERS", "off");
  cr_assert_eq(gr_opt()->peers, 0);
  reload_with("GPURECLAIM_PEER_TIMEOUT", "0.25");
  cr_assert_eq(gr_opt()->peer_timeout_ms, 250);
  reload_with("GPURECLAIM_SIGNAL", "SIGRTMIN+2");
  cr_assert_eq(gr_opt()->signal, SIGRTMIN + 2);
  reload_with("GPURECLAIM_STATUS", "FALSE");
  cr_assert(!gr_opt()->status);
  reload_with("GPURECLAIM_DISABLE", "true");
  cr_assert(gr_opt()->disable);
  reload_with(NULL, NULL);
}

Test(options, a_malformed_value_is_warned_about_once_and_the_default_used) {
  static const struct {
    const char *name, *value, *expected;
  } bad[] = {{"GPURECLAIM_SLEEP_IDLE", "soon", "seconds from 0 (off) to 2592000"},
             {"GPURECLAIM_WAKE_TIMEOUT", "86401", "seconds from 0 to 86400"},
             {"GPURECLAIM_SLEEP", "maybe", "auto, 1/yes/on or 0/no/off"},
             {"GPURECLAIM_OOM_RETRY", "17", "a number of retries from 0 to 16"},
             {"GPURECLAIM_PYTHON", "2", "1/0/yes/no/on/off"},
             {"GPURECLAIM_PEER_TIMEOUT", "0", "seconds from 0.001 to 60 (at most 3 decimals)"},
             {"GPURECLAIM_PEERS", "ask,", "a list of ask, give, sleep, or off"},
             {"GPURECLAIM_ON_SIGNAL", "cached,,all", "a list of cached, orphaned, all, or sleep"},
             {"GPURECLAIM_SIGNAL", "USR3", "USR1, USR2, RTMIN+n or off"},
             {"GPURECLAIM_VERBOSE", "3", "0, 1 or 2"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *err = reload_with(bad[i].name, bad[i].value), *expected = NULL;
    char want[256];
    snprintf(want, sizeof want, "%s=\"%s\" is not valid (expected %s); using the default\n", bad[i].name, bad[i].value,
             bad[i].expected);
    cr_assert_not_null(strstr(err, want), "%s=%s: got\n%s\nwanted\n%s", bad[i].name, bad[i].value, err, want);
    cr_assert_null(strstr(strstr(err, want) + 1, bad[i].name), "warned more than once:\n%s", err);
    cr_assert_eq(gr_opt_check(bad[i].name, bad[i].value, &expected), -EINVAL);
    cr_assert_str_eq(expected, bad[i].expected);
  }
  reload_with("GPURECLAIM_SLEEP_IDLE", "soon");
  cr_assert_eq(gr_opt()->sleep_idle, 0);
  reload_with("GPURECLAIM_WAKE_TIMEOUT", "86401");
  cr_assert_eq(gr_opt()->wake_timeout, 10);
  reload_with("GPURECLAIM_SLEEP", "maybe");
  cr_assert_eq(gr_opt()->sleep, -1);
  reload_with(NULL, NULL);
}

Test(options, defaults_as_written) {
  cr_assert_str_eq(gr_opt_default("GPURECLAIM_ON_SIGNAL"), "cached,orphaned");
  cr_assert_str_eq(gr_opt_default("GPURECLAIM_PEER_TIMEOUT"), "2");
  cr_assert_null(gr_opt_default("GPURECLAIM_RUNDIR"), "computed");
  cr_assert_null(gr_opt_default("GPURECLAIM_LOG"), "none");
  cr_assert_null(gr_opt_default("GPURECLAIM_NO_SUCH"));
}

Test(options, unknown_variables_are_not_options) {
  const char *expected;
  cr_assert_eq(gr_opt_check("GPURECLAIM_LEAK_REPORTS", "1", &expected), -ENOENT);
  cr_assert_str_eq(expected, "a GPURECLAIM_* variable");
}

Test(options, what_names) {
  char buf[64];
  cr_assert_str_eq(gr_opt_what_name(GPURECLAIM_CACHED | GPURECLAIM_ORPHANED, buf, sizeof buf), "cached,orphaned");
  cr_assert_str_eq(gr_opt_what_name(GPURECLAIM_ALL, buf, sizeof buf), "all");
  cr_assert_str_eq(gr_opt_what_name(GPURECLAIM_ORPHANED | GPURECLAIM_ALL, buf, sizeof buf), "orphaned,all");
  cr_assert_str_eq(gr_opt_what_name(GPURECLAIM_CACHED | GPURECLAIM_ORPHANED | GPURECLAIM_ALL, buf, sizeof buf),
                   "cached,orphaned,all");
  cr_assert_str_eq(gr_opt_what_name(0, buf, sizeof buf), "");
}

/* GPURECLAIM_LIMIT: bytes, binary units, a fraction of the device, a percentage; and what is refused. */
Test(options, limit_sizes_and_fractions) {
  static const struct {
    const char *v;
    uint64_t bytes;
    uint32_t ppm;
  } good[] = {{"8589934592", 8589934592ull, 0}, {"8G", 8ull << 30, 0},           {"8GiB", 8ull << 30, 0},
              {"8gb", 8ull << 30, 0},           {"1.5G", 3ull << 29, 0},         {"512M", 512ull << 20, 0},
              {"64k", 64ull << 10, 0},          {"2T", 2ull << 40, 0},           {"1", 1, 0},
              {"0.5", 0, 500000},               {"1.0", 0, 1000000},             {"0.000001", 0, 1},
              {"50%", 0, 500000},               {"100%", 0, 1000000},            {"12.5%", 0, 125000}};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    gr_opt_size_t s = {7, 7};
    cr_assert_eq(gr_opt_parse_size(good[i].v, &s), 0, "%s", good[i].v);
    cr_assert_eq(s.bytes, good[i].bytes, "%s: %llu bytes", good[i].v, (unsigned long long)s.bytes);
    cr_assert_eq(s.ppm, good[i].ppm, "%s: %u ppm", good[i].v, s.ppm);
  }
  static const char *const bad[] = {"",     "0",     "0.0",  "0%",  "1.5",   "1.000001", "101%", "-1",  "8X",
                                    "8GG",  "8 G",   "G",    ".5",  "1.",    "0.0000001", "16E", "99999999999T",
                                    "0.5G%", "1e9",  "0x10", "8Gi", "50 %",  "0.0000001%"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    gr_opt_size_t s;
    const char *expected;
    cr_assert_eq(gr_opt_parse_size(bad[i], &s), -EINVAL, "\"%s\" refused", bad[i]);
    cr_assert_eq(gr_opt_check("GPURECLAIM_LIMIT", bad[i], &expected), -EINVAL);
    cr_assert_not_null(strstr(expected, "unset: no limit"), "the warning says the fix: %s", expected);
  }
  gr_opt_size_t half = {0, 500000}, eight = {8ull << 30, 0};
  cr_assert_eq(gr_opt_size_bytes(&half, 80ull << 30), 40ull << 30);
  cr_assert_eq(gr_opt_size_bytes(&eight, 80ull << 30), 8ull << 30);
  /* A malformed limit says the process runs without one, not "the default". */
  const char *err = reload_with("GPURECLAIM_LIMIT", "1.5");
  cr_assert_not_null(strstr(err, "GPURECLAIM_LIMIT=\"1.5\" is not valid (expected a size (bytes, or K, M, G, T: 8G"), "%s", err);
  cr_assert_not_null(strstr(err, "this process runs WITHOUT a memory limit"), "%s", err);
  cr_assert_eq(gr_opt()->limit.bytes, 0);
  cr_assert_eq(gr_opt()->limit.ppm, 0);
  reload_with("GPURECLAIM_LIMIT", "0.25");
  cr_assert_eq(gr_opt()->limit.ppm, 250000);
  reload_with(NULL, NULL);
  cr_assert_eq(gr_opt()->limit.bytes, 0, "unset: no limit");
}
