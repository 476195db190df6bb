/*
 * python.c -- framework caches, released through the frameworks' own calls via the CPython C API.
 *
 * Only when the process runs CPython (its symbols are visible) and the interpreter is up and not finalizing;
 * only for frameworks that are imported and initialised; never by freeing their blocks (docs/ARCHITECTURE.md,
 * "What may be released": freeing behind a framework's back is a use-after-free):
 *   PyTorch: torch.cuda.empty_cache(), after clearing its cuBLAS workspaces (which go back to its cache), then
 *            its pinned host memory cache (torch._C._host_emptyCache(), where it exists);
 *   CuPy: the default memory pool's and pinned memory pool's free_all_blocks();
 *   any module that defines a callable __gpureclaim_release__() returning the bytes it freed.
 * gr_py_caches() reads, without changing anything, what the same frameworks hold: reserved, in use, and what
 * their release would give back (PyTorch: reserved - allocated - inactive split blocks, memory_summary()'s
 * "non-releasable" part; a module's __gpureclaim_memory__()), for `gpureclaim ps`.
 * Each step runs on its own: one that raises (SystemExit included) is reported, with its traceback, and
 * skipped; the others still run and count. A module's return value must be a non-negative integer below 2^62
 * (None counts as 0); anything else is reported as its error. A KeyboardInterrupt stops the remaining steps
 * and is passed on to the main thread.
 * The bytes a framework gave back are what its own counter says (torch.cuda.memory_reserved, the pool's
 * total_bytes) before minus after. gpureclaim declares the few C API functions it calls itself and finds
 * them with dlsym: it does not link against libpython.
 */
#include "python.h"
#include "real.h"
#include "options.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef void PyObject;
typedef int PyGILState_STATE;
#define Py_file_input 257

static struct {
  int (*IsInitialized)(void);
  int (*IsFinalizing)(void);
  PyGILState_STATE (*GILState_Ensure)(void);
  void (*GILState_Release)(PyGILState_STATE);
  int (*GILState_Check)(void);
  void *(*Eval_SaveThread)(void);
  void (*Eval_RestoreThread)(void *);
  PyObject *(*Dict_New)(void);
  PyObject *(*Dict_GetItemString)(PyObject *, const char *);
  PyObject *(*Run_StringFlags)(const char *, int, PyObject *, PyObject *, void *);
  PyObject *(*Object_CallNoArgs)(PyObject *);
  PyObject *(*Object_CallObject)(PyObject *, PyObject *);
  unsigned long long (*Long_AsUnsignedLongLong)(PyObject *);
  void (*DecRef)(PyObject *);
  PyObject *(*Err_Occurred)(void);
  void (*Err_Clear)(void);
  void (*Err_WriteUnraisable)(PyObject *);
  const char *(*Unicode_AsUTF8)(PyObject *);
} py;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static bool g_have;

static void resolve(void) {
  void *(*sym)(void *, const char *) = gr_real_libc()->dlsym;
#define R(field, name) *(void **)&py.field = sym(RTLD_DEFAULT, name)
  R(IsInitialized, "Py_IsInitialized");
  R(IsFinalizing, "Py_IsFinalizing");
  if (!py.IsFinalizing)
    R(IsFinalizing, "_Py_IsFinalizing");
  R(GILState_Ensure, "PyGILState_Ensure");
  R(GILState_Release, "PyGILState_Release");
  R(GILState_Check, "PyGILState_Check");
  R(Eval_SaveThread, "PyEval_SaveThread");
  R(Eval_RestoreThread, "PyEval_RestoreThread");
  R(Dict_New, "PyDict_New");
  R(Dict_GetItemString, "PyDict_GetItemString");
  R(Run_StringFlags, "PyRun_StringFlags");
  R(Object_CallObject, "PyObject_CallObject");
  R(Long_AsUnsignedLongLong, "PyLong_AsUnsignedLongLong");
  R(DecRef, "Py_DecRef");
  R(Err_Occurred, "PyErr_Occurred");
  R(Err_Clear, "PyErr_Clear");
  R(Err_WriteUnraisable, "PyErr_WriteUnraisable");
  R(Unicode_AsUTF8, "PyUnicode_AsUTF8");
#undef R
  g_have = py.IsInitialized && py.GILState_Ensure && py.GILState_Release && py.GILState_Check &&
           py.Eval_SaveThread && py.Eval_RestoreThread && py.Dict_New && py.Dict_GetItemString &&
           py.Run_StringFlags && py.Object_CallObject && py.Long_AsUnsignedLongLong && py.DecRef &&
           py.Err_Occurred && py.Err_Clear;
}

static bool python_up(void) {
  pthread_once(&g_once, resolve);
  return g_have && py.IsInitialized() && !(py.IsFinalizing && py.IsFinalizing());
}

/* The release, in Python: it runs in the program's interpreter, on gpureclaim's thread, holding the GIL. */
static const char g_code[] =
    "def _gpureclaim_release():\n"
    "    import operator, os, sys\n"
    "    freed = 0\n"
    "    interrupted = False\n"
    "    def failed(what):\n"
    "        try:\n"
    "            import traceback\n"
    "            sys.stderr.write('gpureclaim[%d]: warning: %s failed (below); it is skipped, the rest of '\n"
    "                             'the release goes on\\n' % (os.getpid(), what))\n"
    "            traceback.print_exc()\n"
    "        except BaseException:\n"
    "            pass  # no usable stderr: the release goes on regardless\n"
    "    def step(what, fn):\n"
    "        nonlocal freed, interrupted\n"
    "        if interrupted:\n"
    "            return\n"
    "        try:\n"
    "            n = fn()\n"
    "            if n is not None:\n"
    "                if isinstance(n, bool):\n"
    "                    raise TypeError('returned %r, not a number of bytes' % n)\n"
    "                n = operator.index(n)\n"
    "                if not 0 <= n < 1 << 62:\n"
    "                    raise ValueError('returned %d, not a number of bytes' % n)\n"
    "                freed = min(freed + n, (1 << 63) - 1)\n"
    "        except KeyboardInterrupt:\n"
    "            interrupted = True  # Ctrl-C: stop here, and give it back to the main thread below\n"
    "        except BaseException:  # SystemExit included: a release hook does not end the program\n"
    "            failed(what)\n"
    "    t = sys.modules.get('torch')\n"
    "    def torch_step():\n"
    "        c = getattr(t, 'cuda', None) if t is not None else None\n"
    "        if c is None or not c.is_initialized():\n"
    "            return 0\n"
    "        n = c.device_count()\n"
    "        before = sum(c.memory_reserved(d) for d in range(n))\n"
    "        clear = getattr(getattr(t, '_C', None), '_cuda_clearCublasWorkspaces', None)\n"
    "        if clear is not None:\n"
    "            clear()\n"
    "        c.empty_cache()\n"
    "        return max(0, before - sum(c.memory_reserved(d) for d in range(n)))\n"
    "    step('torch.cuda.empty_cache()', torch_step)\n"
    "    def torch_host_step():\n"
    "        c = getattr(t, 'cuda', None) if t is not None else None\n"
    "        h = getattr(getattr(t, '_C', None), '_host_emptyCache', None) if c is not None else None\n"
    "        if h is not None and c.is_initialized():\n"
    "            h()  # pinned host memory: not device bytes, counted by host_pinned_bytes\n"
    "        return None\n"
    "    step('torch._C._host_emptyCache()', torch_host_step)\n"
    "    cp = sys.modules.get('cupy')\n"
    "    def cupy_step():\n"
    "        if cp is None or not hasattr(cp, 'get_default_memory_pool'):\n"
    "            return 0\n"
    "        pool = cp.get_default_memory_pool()\n"
    "        before = pool.total_bytes()\n"
    "        pool.free_all_blocks()\n"
    "        cp.get_default_pinned_memory_pool().free_all_blocks()\n"
    "        return max(0, before - pool.total_bytes())\n"
    "    step('cupy free_all_blocks()', cupy_step)\n"
    "    for name, m in list(sys.modules.items()):\n"
    "        try:\n"
    "            f = getattr(m, '__dict__', {}).get('__gpureclaim_release__')\n"
    "        except BaseException:\n"
    "            continue\n"
    "        if callable(f):\n"
    "            step('%s.__gpureclaim_release__()' % name, f)\n"
    "    if interrupted:\n"
    "        import _thread\n"
    "        _thread.interrupt_main()\n"
    "    return freed\n";

static PyObject *g_fn; /* the compiled function, kept for the process's life */

uint64_t gr_py_release(void) {
  if (!python_up())
    return 0;
  PyGILState_STATE st = py.GILState_Ensure();
  uint64_t freed = 0;
  if (!g_fn) {
    PyObject *globals = py.Dict_New();
    PyObject *r = globals ? py.Run_StringFlags(g_code, Py_file_input, globals, globals, NULL) : NULL;
    if (r) {
      py.DecRef(r);
      g_fn = py.Dict_GetItemString(globals, "_gpureclaim_release"); /* borrowed; globals stay alive */
    } else if (globals) {
      py.DecRef(globals);
    }
  }
  if (g_fn) {
    PyObject *r = py.Object_CallObject(g_fn, NULL);
    if (r) {
      freed = py.Long_AsUnsignedLongLong(r);
      py.DecRef(r);
    }
  }
  if (py.Err_Occurred()) { /* outside the steps, which report their own: never PyErr_Print (it exits on
                              * SystemExit) */
    gr_warn_once(w_py, "the Python part of a release failed (shown below); it is skipped");
    if (py.Err_WriteUnraisable)
      py.Err_WriteUnraisable(NULL);
    py.Err_Clear();
    freed = freed == (uint64_t)-1 ? 0 : freed;
  }
  py.GILState_Release(st);
  return freed;
}

void *gr_py_save_if_held(void) {
  if (!python_up() || !py.GILState_Check())
    return NULL;
  return py.Eval_SaveThread();
}

void gr_py_restore(void *state) {
  if (state)
    py.Eval_RestoreThread(state);
}

/* What the frameworks hold, one line each: "name device reserved allocated releasable". Reads their counters
 * only (torch.cuda.memory_stats(), CuPy's pool totals, a module's __gpureclaim_memory__() returning a dict with
 * "reserved", "allocated" and optionally "releasable" and "device"); nothing is freed, nothing is printed, and
 * a framework whose counters raise is left out. */
static const char g_caches_code[] =
    "def _gpureclaim_caches():\n"
    "    try:\n"
    "        return _caches()\n"
    "    except KeyboardInterrupt:\n"
    "        import _thread\n"
    "        _thread.interrupt_main()  # Ctrl-C meant for the program: given back to its main thread\n"
    "        return ''\n"
    "def _caches():\n"
    "    import sys\n"
    "    out = []\n"
    "    def add(name, dev, reserved, allocated, releasable=None):\n"
    "        reserved, allocated = max(0, int(reserved)), max(0, int(allocated))\n"
    "        free = max(0, reserved - allocated)\n"
    "        releasable = free if releasable is None else min(free, max(0, int(releasable)))\n"
    "        out.append('%s %d %d %d %d' % (name.replace(' ', '_')[:40], int(dev), reserved, allocated, releasable))\n"
    "    try:\n"
    "        t = sys.modules.get('torch')\n"
    "        c = getattr(t, 'cuda', None) if t is not None else None\n"
    "        if c is not None and c.is_initialized():\n"
    "            for d in range(c.device_count()):\n"
    "                s = c.memory_stats(d)\n"
    "                r = s.get('reserved_bytes.all.current', 0)\n"
    "                a = s.get('allocated_bytes.all.current', 0)\n"
    "                if r:\n"
    "                    add('pytorch', d, r, a, r - a - s.get('inactive_split_bytes.all.current', 0))\n"
    "    except Exception:\n"
    "        pass\n"
    "    try:\n"
    "        cp = sys.modules.get('cupy')\n"
    "        if cp is not None and hasattr(cp, 'get_default_memory_pool'):\n"
    "            pool = cp.get_default_memory_pool()\n"
    "            if pool.total_bytes():\n"
    "                add('cupy', cp.cuda.Device().id, pool.total_bytes(), pool.used_bytes())\n"
    "    except Exception:\n"
    "        pass\n"
    "    for name, m in list(sys.modules.items()):\n"
    "        try:\n"
    "            f = getattr(m, '__dict__', {}).get('__gpureclaim_memory__')\n"
    "            if callable(f):\n"
    "                v = f()\n"
    "                add(name, v.get('device', 0), v['reserved'], v['allocated'], v.get('releasable'))\n"
    "        except Exception:\n"
    "            pass\n"
    "    return '\\n'.join(out[:64])\n";

static PyObject *g_caches_fn; /* compiled once, kept for the process's life */

int gr_py_caches(gr_py_cache_t *out, int max) {
  if (!gr_opt()->python || !python_up() || !py.Unicode_AsUTF8)
    return 0;
  PyGILState_STATE st = py.GILState_Ensure();
  int n = 0;
  if (!g_caches_fn) {
    PyObject *globals = py.Dict_New();
    PyObject *r = globals ? py.Run_StringFlags(g_caches_code, Py_file_input, globals, globals, NULL) : NULL;
    if (r) {
      py.DecRef(r);
      g_caches_fn = py.Dict_GetItemString(globals, "_gpureclaim_caches");
    } else if (globals) {
      py.DecRef(globals);
    }
  }
  PyObject *r = g_caches_fn ? py.Object_CallObject(g_caches_fn, NULL) : NULL;
  const char *text = r ? py.Unicode_AsUTF8(r) : NULL;
  for (const char *line = text; line && *line && n < max;) {
    gr_py_cache_t *c = &out[n];
    unsigned long long reserved, allocated, releasable;
    int dev, used = 0;
    if (sscanf(line, "%39s %d %llu %llu %llu%n", c->name, &dev, &reserved, &allocated, &releasable, &used) == 5) {
      c->device = dev;
      c->reserved = reserved;
      c->allocated = allocated;
      c->releasable = releasable;
      n++;
    }
    const char *nl = strchr(line, '\n');
    line = nl ? nl + 1 : NULL;
  }
  if (r)
    py.DecRef(r);
  if (py.Err_Occurred()) /* the code catches what the frameworks raise; anything else is dropped unseen */
    py.Err_Clear();
  py.GILState_Release(st);
  return n;
}
