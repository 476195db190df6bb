/*
 * leaks.c -- the leak report: the blocks still in the table, grouped by allocating stack (one call site
 * without backtraces), largest first, as text like LeakSanitizer's or as JSON (docs/PROTOCOL.md).
 */
#include "registry.h"
#include "stacks.h"
#include "json.h"
#include "report.h"
#include "state.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- leak reports ---- */

typedef struct leak_group {
  gr_site_t site; /* as recorded: blocks of one stack (one call site without backtraces) form a group */
  uintptr_t pc;
  unsigned kind;
  uint64_t blocks, bytes;
} leak_group_t;

typedef struct {
  leak_group_t *g;
  size_t n, cap;
  uint64_t dev_blocks[GR_MAX_DEV + 1], dev_bytes[GR_MAX_DEV + 1];
  uint64_t blocks, bytes;
  bool nomem; /* a group could not be added: the report would miss blocks */
} leaks_t;

static int leak_block(gr_ref_t *ref, const gr_rec_t *r, void *arg) {
  (void)ref;
  leaks_t *l = arg;
  if ((r->state != GR_ST_LIVE && r->state != GR_ST_ORPHAN && r->state != GR_ST_RELEASED) ||
      r->kind == GPURECLAIM_KIND_VMM_MAPPING || r->kind == GPURECLAIM_KIND_VA)
    return 0;
  size_t i;
  for (i = 0; i < l->n; i++)
    if (gr_site_same(l->g[i].site, r->site) && l->g[i].kind == r->kind)
      break;
  if (i == l->n) {
    if (l->n == l->cap) {
      size_t cap = l->cap ? l->cap * 2 : 32;
      leak_group_t *p = realloc(l->g, cap * sizeof *p);
      if (!p) {
        l->nomem = true;
        return 1; /* stop: an incomplete report is not written */
      }
      l->g = p;
      l->cap = cap;
    }
    l->g[l->n++] = (leak_group_t){r->site, gr_site_pc(r->site), r->kind, 0, 0};
  }
  l->g[i].blocks++;
  l->g[i].bytes += r->size;
  int d = r->device < GR_MAX_DEV ? r->device : GR_MAX_DEV;
  l->dev_blocks[d]++;
  l->dev_bytes[d] += r->size;
  l->blocks++;
  l->bytes += r->size;
  return 0;
}

static int by_bytes(const void *a, const void *b) {
  const leak_group_t *x = a, *y = b;
  return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : 0;
}

static void symbolize(uintptr_t pc, char *buf, size_t len) {
  Dl_info info;
  if (pc && dladdr((void *)pc, &info) && info.dli_sname)
    snprintf(buf, len, "%s+0x%lx", info.dli_sname, (unsigned long)(pc - (uintptr_t)info.dli_saddr));
  else
    buf[0] = '\0';
}

/* "module+0xoffset" of pc (the module's file name and pc's offset from its load address): what addr2line -e
 * and LeakSanitizer's reports use, stable across runs of a position-independent program. */
static void locate(uintptr_t pc, char *buf, size_t len) {
  Dl_info info;
  struct link_map *lm = NULL;
  /* The offset is from the module's load bias (l_addr), not the address it is mapped at: 0 for a program
   * linked at a fixed address (-no-pie), whose file addresses are the absolute ones addr2line expects. */
  if (pc && dladdr1((void *)pc, &info, (void **)&lm, RTLD_DL_LINKMAP) && lm)
    snprintf(buf, len, "%s+0x%lx", gr_reg_library(pc).name, (unsigned long)(pc - (uintptr_t)lm->l_addr));
  else
    snprintf(buf, len, "?");
}

int gr_report_leaks(jbuf_t *b, bool json) {
  leaks_t *l = calloc(1, sizeof *l);
  if (!l)
    return -ENOMEM;
  if (atomic_load_explicit(&gr_state_run, memory_order_acquire) == 1)
    gr_table_visit(leak_block, l);
  if (l->nomem) {
    free(l->g);
    free(l);
    return -ENOMEM;
  }
  if (l->n) /* qsort of a NULL array is undefined even for no elements */
    qsort(l->g, l->n, sizeof *l->g, by_bytes);
  char sym[256], hb[32];
  if (json) {
    jb_obj(b);
    jb_i64(b, "pid", getpid());
    jb_u64(b, "blocks", l->blocks);
    jb_u64(b, "bytes", l->bytes);
    jb_arr(b, "devices");
    for (int d = 0; d <= GR_MAX_DEV; d++)
      if (l->dev_blocks[d]) {
        jb_key(b, NULL);
        jb_obj(b);
        jb_i64(b, "device", d == GR_MAX_DEV ? -1 : d);
        jb_u64(b, "blocks", l->dev_blocks[d]);
        jb_u64(b, "bytes", l->dev_bytes[d]);
        jb_obj_end(b);
      }
    jb_arr_end(b);
    jb_arr(b, "groups");
    for (size_t i = 0; i < l->n; i++) {
      leak_group_t *g = &l->g[i];
      jb_key(b, NULL);
      jb_obj(b);
      jb_str(b, "library", gr_reg_library(g->pc).name);
      jb_hex(b, "caller", g->pc);
      symbolize(g->pc, sym, sizeof sym);
      jb_str(b, "symbol", sym[0] ? sym : NULL);
      jb_str(b, "kind", gr_kind_name((int)g->kind));
      jb_u64(b, "blocks", g->blocks);
      jb_u64(b, "bytes", g->bytes);
      jb_arr(b, "frames");
      uintptr_t frames[GR_STACK_MAX];
      int nf = gr_site_frames(g->site, frames, GR_STACK_MAX);
      for (int f = 0; f < nf; f++)
        jb_hex(b, NULL, frames[f]);
      jb_arr_end(b);
      jb_arr(b, "locations");
      for (int f = 0; f < nf; f++) {
        locate(frames[f], sym, sizeof sym);
        jb_str(b, NULL, sym);
      }
      jb_arr_end(b);
      jb_obj_end(b);
    }
    jb_arr_end(b);
    jb_obj_end(b);
  } else {
    gr_log_bytes(l->bytes, hb, sizeof hb);
    jb_printf(b, "=================================================================\n");
    jb_printf(b, "gpureclaim[%d]: %llu block%s (%s) %s never freed\n", (int)getpid(), (unsigned long long)l->blocks,
              gr_plural(l->blocks), hb, l->blocks == 1 ? "was" : "were");
    for (int d = 0; d <= GR_MAX_DEV; d++)
      if (l->dev_blocks[d]) {
        gr_log_bytes(l->dev_bytes[d], hb, sizeof hb);
        if (d == GR_MAX_DEV)
          jb_printf(b, "Host (pinned): %llu block%s, %s\n", (unsigned long long)l->dev_blocks[d],
                    gr_plural(l->dev_blocks[d]), hb);
        else
          jb_printf(b, "Device %d: %llu block%s, %s\n", d, (unsigned long long)l->dev_blocks[d],
                    gr_plural(l->dev_blocks[d]), hb);
      }
    for (size_t i = 0; i < l->n; i++) {
      leak_group_t *g = &l->g[i];
      gr_lib_t lib = gr_reg_library(g->pc);
      gr_log_bytes(g->bytes, hb, sizeof hb);
      symbolize(g->pc, sym, sizeof sym);
      jb_printf(b, "\n%llu block%s, %s (%s) allocated by %s at %#lx%s%s%s\n", (unsigned long long)g->blocks,
                gr_plural(g->blocks), hb, gr_kind_name((int)g->kind), lib.name, (unsigned long)g->pc,
                sym[0] ? " (" : "", sym, sym[0] ? ")" : "");
      uintptr_t frames[GR_STACK_MAX];
      int nf = gr_site_frames(g->site, frames, GR_STACK_MAX);
      for (int f = 0; f < nf; f++) {
        char at[300];
        symbolize(frames[f], sym, sizeof sym);
        locate(frames[f], at, sizeof at);
        jb_printf(b, "    #%d %#lx in %s (%s)\n", f, (unsigned long)frames[f], sym[0] ? sym : "??", at);
      }
    }
    if (!l->n)
      jb_printf(b, "(every block was freed)\n");
  }
  free(l->g);
  free(l);
  return jb_failed(b) ? -ENOMEM : 0;
}


int gr_report_leaks_fd(int fd, bool json) {
  jbuf_t b;
  jb_init(&b);
  int rc = gr_report_leaks(&b, json);
  if (rc == 0)
    rc = jb_write_fd(&b, fd);
  jb_free(&b);
  return rc;
}
