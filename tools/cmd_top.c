/*
 * cmd_top.c -- `gpureclaim top`: ps's tables (ps.h), refreshed. On a terminal it is a full-screen view drawn
 * with ncurses (which only updates what changed: no flicker), cut to the terminal's width, with keys to move a
 * selection, release or snapshot the selected process, change the sort and quit. When standard input or output
 * is not a terminal, or with --json, frames are printed one after another (--iterations N stops after N), for
 * scripts and logs. ncurses is linked into the command only, never into the preloaded library; a build
 * configured without its headers prints frames on a terminal too, saying so (GR_HAVE_CURSES 0).
 */
#include "ps.h"
#include "common.h"
#include "options.h"
#include "outfile.h"

#if GR_HAVE_CURSES
#include <curses.h>
#endif
#include <errno.h>
#include <getopt.h>
#include <locale.h>
#include <signal.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const cmd_opt_t g_opts[] = {
    {'d', 'd', "interval", CMD_ARG, "S", "seconds between refreshes (default 2, at least 0.1)"},
    {'n', 'n', "iterations", CMD_ARG, "N", "stop after N frames (default: until q or ^C)"},
    {'i', 'i', "gpu", CMD_ARG, "GPUS", "only these GPUs (indices as nvidia-smi numbers them, or UUIDs,\n"
                                      "comma-separated), as ps -i"},
    {'S', 'S', "sort", CMD_ARG, "FIELD", "as ps --sort (default held)"},
    {'j', 'j', "json", CMD_NOARG, NULL, "one JSON object per frame (ps --json's), one per line (JSON Lines)"},
    {0}};

const cmd_spec_t cmd_top_spec = {
    .name = "top",
    .usage = "top [-d S] [-n N] [-i GPUS] [-S FIELD] [--json]",
    .summary = "ps, refreshed every S seconds (default 2); full screen on a terminal",
    .text = "ps, refreshed. On a terminal, a full-screen view; keys (h or ? shows them there too):\n"
            "  Up/Down, k/j   select a process        r   release it (what its GPURECLAIM_ON_SIGNAL says)\n"
            "  s              snapshot it, to gpureclaim-snapshot-PID-TIME.json in the current directory\n"
            "  > / <          next / previous sort     space  refresh now        q, ^C   quit\n"
            "  Left/Right     scroll the tables sideways (every column); Home: back\n"
            "Colours (unless NO_COLOR is set): blue asleep, yellow not answering.\n"
            "Not on a terminal (or with --json), frames are printed one after another (--json: ps --json's object,\n"
            "one per line, each with its time).\n",
    .opts = g_opts,
    .tail = "",
};

typedef struct top_opts {
  double interval;
  long iterations;
  ps_filter_t filter;
  int sort;
} top_opts_t;

/* ---- frames printed one after another ---- */

static int write_error(void) {
  /* Output that cannot be written ends top, which would otherwise go on forever (`top > /dev/full`), with the
   * error as main() reports it for the other commands; a reader that went away (EPIPE) ends it without one.
   * What could not be written is discarded so that main() does not try, and report, it again. */
  errno = 0;
  if (fflush(stdout) == 0 && !ferror(stdout))
    return -1;
  int e = errno ? errno : EIO;
  __fpurge(stdout);
  clearerr(stdout);
  if (e == EPIPE)
    return EX_OK;
  fprintf(stderr, "gpureclaim: cannot write the output: %s\n", strerror(e));
  return EX_FAILED;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

static int plain(const top_opts_t *o) {
  for (long it = 0; o->iterations < 0 || it < o->iterations; it++) {
    if (it)
      sleep_s(o->interval);
    ps_view_t v;
    ps_collect(&v, &o->filter, o->sort);
    if (cmd_rundir_refused()) {
      ps_free(&v);
      return EX_FAILED;
    }
    if (cmd_json_out()) {
      ps_print_json(stdout, &v, &o->filter); /* one object per line: JSON Lines */
    } else {
      time_t now = time(NULL);
      char ts[64];
      strftime(ts, sizeof ts, "%H:%M:%S", localtime(&now));
      printf("gpureclaim top - %s - %zu process%s (every %.1fs, sorted by %s)\n\n", ts, v.n, v.n == 1 ? "" : "es",
             o->interval, ps_sort_name(o->sort));
      ps_print_table(stdout, &v, &o->filter, false);
      putchar('\n');
    }
    ps_free(&v);
    int rc = write_error();
    if (rc >= 0)
      return rc;
  }
  return EX_OK;
}

/* ---- the full-screen view ---- */

#if GR_HAVE_CURSES

typedef struct screen {
  ps_view_t v;
  pid_t selected; /* followed across refreshes by pid */
  size_t sel, top;
  int hscroll;    /* columns the tables are scrolled to the left (Left/Right); 0: fitted to the terminal */
  bool help;      /* the keys are shown (h, ?) */
  bool colour;
  char msg[512];
} screen_t;

/* Colour pairs: asleep (its memory is on the host), not answering, the title and headers, a message. */
enum { C_ASLEEP = 1, C_SILENT, C_HEAD, C_MSG };

static attr_t colour(const screen_t *s, int pair) { return s->colour ? COLOR_PAIR(pair) : 0; }

/* s after its first n characters (UTF-8), for a line scrolled n columns to the left. */
static const char *skip_chars(const char *str, int n) {
  while (*str && n > 0) {
    str++;
    while (((unsigned char)*str & 0xc0) == 0x80)
      str++;
    n--;
  }
  return str;
}

static void line_at(int y, const char *str, attr_t attr) {
  if (y < 0 || y >= LINES)
    return;
  move(y, 0);
  clrtoeol();
  attron(attr);
  addnstr(str, COLS); /* at most COLS bytes, so at most COLS characters: it never wraps */
  for (int x = getcurx(stdscr); attr && x < COLS && getcury(stdscr) == y; x++)
    addch(' '); /* the bar across the whole line */
  attroff(attr);
}

/* Prose (a message, the keys) cut at a word's end to fit width, with " ..." when cut. */
static void prose(char *buf, size_t len, const char *text, int width) {
  snprintf(buf, len, "%s", text);
  if (width <= 4 || strlen(buf) <= (size_t)width)
    return;
  size_t w = (size_t)width - 4;
  while (w > 0 && buf[w] != ' ')
    w--;
  while (w > 0 && buf[w - 1] == ' ')
    w--;
  if (w == 0)
    w = (size_t)width - 4;
  while (w > 0 && ((unsigned char)buf[w] & 0xc0) == 0x80)
    w--;
  snprintf(buf + w, len - w, " ...");
}

/* A table line: fitted to the terminal, or with every column when scrolled and shown from hscroll. */
static void table_line(const screen_t *s, int y, const char *text, attr_t attr) {
  line_at(y, s->hscroll ? skip_chars(text, s->hscroll) : text, attr);
}

static const char g_keys_short[] = "q quit  h help  r release  s snapshot  </> sort  up/down select  left/right scroll";

static const char *const g_help_lines[] = {
    "Keys",
    "  Up, Down, k, j      select a process (PgUp, PgDn: ten at a time)",
    "  r                   release the selected process (what its GPURECLAIM_ON_SIGNAL says)",
    "  s                   write its snapshot to gpureclaim-snapshot-PID-TIME.json here",
    "  > <                 next, previous sort (held, cached, releasable, ...)",
    "  Left, Right, Home   scroll the tables sideways (every column), back",
    "  space               refresh now",
    "  h, ?                this help (any key closes it)",
    "  q, ^C               quit",
    "",
    "STATE: awake, sleeping (its memory is on the host: gpureclaim wake PID),",
    "waking, waiting (for memory), stopped (SIGSTOP, ^Z, a debugger), silent (not",
    "answering); the last two show their status file's last figures. Under the",
    "table, the selected process's limit, guarantee and wait. GPUs are numbered",
    "as nvidia-smi numbers them. gpureclaim top --help and man gpureclaim say more.",
    NULL};

static void draw(screen_t *s, const top_opts_t *o) {
  char line[1024];
  int width = s->hscroll ? 0 : COLS; /* scrolled: every column, the wide layout */
  erase();
  time_t now = time(NULL);
  char ts[64];
  strftime(ts, sizeof ts, "%H:%M:%S", localtime(&now));
  snprintf(line, sizeof line, "gpureclaim top%s - %s - %zu process%s - every %.1fs - sorted by %s",
           s->hscroll ? " (scrolled; Home: back)" : "", ts, s->v.n, s->v.n == 1 ? "" : "es", o->interval,
           ps_sort_name(o->sort));
  char title[1024];
  prose(title, sizeof title, line, COLS);
  line_at(0, title, A_BOLD | colour(s, C_HEAD));
  int y = 2;
  if (s->help) {
    for (int i = 0; g_help_lines[i] && y < LINES - 1; i++) {
      prose(line, sizeof line, g_help_lines[i], COLS);
      line_at(y++, line, i == 0 ? A_BOLD : 0);
    }
    line_at(LINES - 1, "any key: back to the table", A_DIM);
    refresh();
    return;
  }
  if (s->v.ngpus) {
    ps_gpu_header(line, sizeof line, width);
    table_line(s, y++, line, A_BOLD | colour(s, C_HEAD));
    for (size_t i = 0; i < s->v.ngpus && y < LINES - 4; i++) {
      ps_gpu_line(&s->v.gpus[i], line, sizeof line, width);
      table_line(s, y++, line, 0);
    }
    y++;
  }
  ps_row_header(line, sizeof line, width);
  table_line(s, y++, line, A_REVERSE);
  /* The selected process's framework caches, under the table (two lines each rather than one cut short). */
  char *fw = NULL;
  size_t fwlen = 0;
  int fwlines = 0;
  if (s->v.n) {
    FILE *m = open_memstream(&fw, &fwlen);
    if (m) {
      ps_print_frameworks(m, &s->v.rows[s->sel], &o->filter, COLS);
      ps_print_sharing(m, &s->v.rows[s->sel], &o->filter, COLS);
      fclose(m);
    }
    for (size_t i = 0; fw && i < fwlen; i++)
      fwlines += fw[i] == '\n';
  }
  int rows = LINES - 1 - y - fwlines; /* the last line is for keys and messages */
  if (rows < 1) {
    fwlines = 0;
    rows = LINES - 1 - y;
  }
  if (rows > 0) {
    if (s->sel < s->top)
      s->top = s->sel;
    if (s->sel >= s->top + (size_t)rows)
      s->top = s->sel - (size_t)rows + 1;
  }
  for (size_t i = s->top; i < s->v.n && rows > 0 && y < LINES - 1 - fwlines; i++) {
    const ps_row_t *r = &s->v.rows[i];
    ps_row_line(r, line, sizeof line, width);
    attr_t a = r->asleep ? colour(s, C_ASLEEP) : !r->stats ? colour(s, C_SILENT) : 0;
    table_line(s, y++, line, i == s->sel ? A_REVERSE | A_BOLD | a : a);
  }
  if (!s->v.n) {
    prose(line, sizeof line, o->filter.n ? "(no process of yours is running gpureclaim on the GPUs selected)"
                                         : "(no process of yours is running gpureclaim)", COLS);
    line_at(y++, line, 0);
  }
  for (char *p = fw, *nl; fwlines && p && *p && (nl = strchr(p, '\n')); p = nl + 1) {
    *nl = '\0';
    line_at(y++, p + strspn(p, " "), A_DIM);
  }
  free(fw);
  prose(line, sizeof line, s->msg[0] ? s->msg : g_keys_short, COLS);
  line_at(LINES - 1, line, s->msg[0] ? A_BOLD | colour(s, C_MSG) : A_DIM);
  refresh();
}

static void collect(screen_t *s, const top_opts_t *o) {
  ps_free(&s->v);
  ps_collect(&s->v, &o->filter, o->sort);
  s->sel = 0;
  for (size_t i = 0; i < s->v.n; i++)
    if (s->v.rows[i].p.pid == s->selected)
      s->sel = i;
  s->selected = s->v.n ? s->v.rows[s->sel].p.pid : 0;
}

static void select_row(screen_t *s, long delta) {
  if (!s->v.n)
    return;
  long i = (long)s->sel + delta;
  s->sel = i < 0 ? 0 : (size_t)i >= s->v.n ? s->v.n - 1 : (size_t)i;
  s->selected = s->v.rows[s->sel].p.pid;
}

static void release_selected(screen_t *s, const top_opts_t *o) {
  if (!s->v.n)
    return;
  const ps_row_t *r = &s->v.rows[s->sel];
  snprintf(s->msg, sizeof s->msg, "releasing %d ...", (int)r->p.pid);
  draw(s, o);
  const char *why = NULL;
  jnode_t *a = cmd_ask(&r->p, "release", 30.0, &why, NULL);
  const jnode_t *rep = jget(a, "report");
  if (a && jbool(a, "ok", false) && rep) {
    char b1[32], b2[32], b3[32];
    int64_t c = jint(rep, "cached_bytes", 0), orph = jint(rep, "orphaned_bytes", 0), all = jint(rep, "all_bytes", 0);
    snprintf(s->msg, sizeof s->msg, "%d released %s (cached %s, orphaned %s) in %.3g ms", (int)r->p.pid,
             cmd_bytes((uint64_t)(c + orph + all), b1, sizeof b1), cmd_bytes((uint64_t)c, b2, sizeof b2),
             cmd_bytes((uint64_t)orph, b3, sizeof b3), jget(rep, "ms") ? jget(rep, "ms")->num : 0.0);
  } else {
    snprintf(s->msg, sizeof s->msg, "%d did not release: %s", (int)r->p.pid,
             a ? jstr(a, "error", "refused") : why ? why : "no answer");
  }
  if (a) {
    jdelete(a);
  }
}

static void snapshot_selected(screen_t *s, const top_opts_t *o) {
  if (!s->v.n)
    return;
  const ps_row_t *r = &s->v.rows[s->sel];
  snprintf(s->msg, sizeof s->msg, "taking a snapshot of %d ...", (int)r->p.pid);
  draw(s, o);
  const char *why = NULL;
  jnode_t *a = cmd_ask(&r->p, "snapshot", 30.0, &why, NULL);
  const jnode_t *snap = jget(a, "snapshot");
  if (a && jbool(a, "ok", false) && snap) {
    char path[128], ts[32];
    time_t now = time(NULL);
    strftime(ts, sizeof ts, "%Y%m%d-%H%M%S", localtime(&now));
    snprintf(path, sizeof path, "gpureclaim-snapshot-%d-%s.json", (int)r->p.pid, ts);
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    int rc = -ENOMEM;
    if (m) {
      cmd_json_dump(m, snap);
      fputc('\n', m);
      if (fclose(m) == 0 && text)
        rc = gr_out_write(path, text, len, 0644);
    }
    free(text);
    if (rc == 0)
      snprintf(s->msg, sizeof s->msg, "snapshot of %d written to %s (gpureclaim snapshot %d shows it grouped)",
               (int)r->p.pid, path, (int)r->p.pid);
    else
      snprintf(s->msg, sizeof s->msg, "cannot write %s: %s", path, strerror(-rc));
  } else {
    snprintf(s->msg, sizeof s->msg, "no snapshot of %d: %s", (int)r->p.pid,
             a ? jstr(a, "error", "refused") : why ? why : "no answer");
  }
  if (a) {
    jdelete(a);
  }
}

/* Notes of the command (a stale status file removed, ...) while the screen is ncurses': shown on the message
 * line, never written to the terminal under it. */
static void note_to_screen(const char *note, void *arg) {
  screen_t *s = arg;
  snprintf(s->msg, sizeof s->msg, "%s", note);
}

static volatile sig_atomic_t g_quit;
static void on_quit(int sig) {
  (void)sig;
  g_quit = 1;
}

static int full_screen(top_opts_t *o) {
  /* ^C and SIGTERM quit as q does: the terminal is restored and the exit status is 0. Installed before newterm(),
   * which then leaves them to us. */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_quit;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  setlocale(LC_CTYPE, ""); /* the terminal's character set: UTF-8 command lines as characters */
  SCREEN *scr = newterm(NULL, stdout, stdin);
  if (!scr) {
    fprintf(stderr, "gpureclaim: top: cannot use the terminal (TERM=%s); printing frames instead\n",
            getenv("TERM") ? getenv("TERM") : "");
    return plain(o);
  }
  cbreak();
  noecho();
  keypad(stdscr, TRUE);
  curs_set(0);
  screen_t s;
  memset(&s, 0, sizeof s);
  /* Colour where the terminal has it, unless NO_COLOR is set (no-color.org). */
  const char *no_colour = getenv("NO_COLOR");
  if (has_colors() && !(no_colour && *no_colour) && start_color() == OK) {
    use_default_colors();
    init_pair(C_ASLEEP, COLOR_BLUE, -1);
    init_pair(C_SILENT, COLOR_YELLOW, -1);
    init_pair(C_HEAD, COLOR_CYAN, -1);
    init_pair(C_MSG, COLOR_GREEN, -1);
    s.colour = true;
  }
  cmd_set_note_sink(note_to_screen, &s);
  long frames = 0;
  int rc = EX_OK;
  bool again = true;
  struct timespec next = {0, 0};
  while (!g_quit) {
    if (again) {
      collect(&s, o);
      if (cmd_rundir_refused()) {
        rc = EX_FAILED;
        break;
      }
      frames++;
      clock_gettime(CLOCK_MONOTONIC, &next);
      next.tv_sec += (time_t)o->interval;
      next.tv_nsec += (long)((o->interval - (double)(time_t)o->interval) * 1e9);
      if (next.tv_nsec >= 1000000000L) {
        next.tv_sec++;
        next.tv_nsec -= 1000000000L;
      }
      again = false;
    }
    draw(&s, o);
    if (o->iterations > 0 && frames >= o->iterations)
      break;
    int wait = gr_ms_until(&next);
    timeout(wait > 0 ? wait : 0);
    int ch = getch();
    if (g_quit)
      break;
    if (s.help && ch != ERR && ch != KEY_RESIZE) { /* any key closes the help */
      s.help = false;
      continue;
    }
    switch (ch) {
    case ERR: again = gr_ms_until(&next) == 0; break;
    case 'q':
    case 'Q': goto out;
    case KEY_UP:
    case 'k': select_row(&s, -1); break;
    case KEY_DOWN:
    case 'j': select_row(&s, 1); break;
    case KEY_PPAGE: select_row(&s, -10); break;
    case KEY_NPAGE: select_row(&s, 10); break;
    case '>':
    case '<':
      o->sort = (o->sort + (ch == '>' ? 1 : ps_sort_count() - 1)) % ps_sort_count();
      snprintf(s.msg, sizeof s.msg, "sorted by %s", ps_sort_name(o->sort));
      again = true;
      break;
    case 'r':
      release_selected(&s, o);
      again = true;
      break;
    case 's':
      snapshot_selected(&s, o);
      break;
    case ' ':
      s.msg[0] = '\0';
      again = true;
      break;
    case 'h':
    case '?':
      s.help = true;
      s.msg[0] = '\0';
      break;
    case KEY_LEFT: s.hscroll = s.hscroll > 8 ? s.hscroll - 8 : 0; break;
    case KEY_RIGHT: s.hscroll += 8; break;
    case KEY_HOME: s.hscroll = 0; break;
    case KEY_RESIZE:
      /* Drawn anew at the new size, every cell: a terminal that reflowed its lines on the resize left what
       * ncurses believed was there elsewhere, and the diff-based redraw left those leftovers. */
      clearok(curscr, TRUE);
      break;
    case 12: /* ^L: repaint everything, as in every full-screen program */
      clearok(curscr, TRUE);
      break;
    default:
      snprintf(s.msg, sizeof s.msg, "unknown key (h: the keys)");
      break;
    }
  }
out:
  cmd_set_note_sink(NULL, NULL);
  endwin();
  delscreen(scr);
  if (rc != EX_OK && s.msg[0]) /* why top ends (a run directory refused): on the terminal, now the shell's */
    fprintf(stderr, "gpureclaim: %s\n", s.msg);
  ps_free(&s.v);
  return rc;
}
#else
/* Built without ncurses (its headers were missing when the build was configured): frames are printed one after
 * another, as off a terminal, and top says once why and what to install. */
static int full_screen(top_opts_t *o) {
  fprintf(stderr, "gpureclaim: top: this gpureclaim was built without ncurses, so there is no full-screen view; "
                  "printing frames instead (install libncurses-dev, or ncurses-devel, and build again)\n");
  return plain(o);
}
#endif

int cmd_top(int argc, char **argv) {
  top_opts_t o = {.interval = 2, .iterations = -1, .sort = ps_sort_key("held")};
  optind = 1;
  int c;
  while ((c = cmd_getopt(argc, argv, &cmd_top_spec)) != -1) {
    char *end;
    switch (c) {
    case 'd':
      if (!cmd_parse_seconds(optarg, &o.interval) || o.interval < 0.1)
        return cmd_usage_error("top: bad interval %s (0.1 to 86400 seconds)", optarg);
      break;
    case 'n':
      errno = 0;
      o.iterations = strtol(optarg, &end, 10);
      if (errno || end == optarg || *end || o.iterations < 1)
        return cmd_usage_error("top: bad iterations %s (a whole number, 1 or more)", optarg);
      break;
    case 'i':
      if (!ps_parse_filter(optarg, &o.filter))
        return cmd_usage_error("top: bad --gpu %s (ordinals or UUIDs, comma-separated)", optarg);
      break;
    case 'S':
      if ((o.sort = ps_sort_key(optarg)) < 0)
        return cmd_usage_error("top: unknown --sort field %s (the fields are ps's, as ps --help lists them)", optarg);
      break;
    case 'j': cmd_set_json(true); break;
    case 'h': return cmd_help(&cmd_top_spec);
    default:
      return EX_USAGE;
    }
  }
  if (optind < argc)
    return cmd_usage_error("top: unexpected argument: %s", argv[optind]);
  if (!cmd_json_out() && isatty(STDIN_FILENO) && isatty(STDOUT_FILENO))
    return full_screen(&o);
  return plain(&o);
}
