# trace_pair.py -- a gdb script: the instructions one allocation + free pair executes, one at a time.
#
# Run bench_hooks' child under gdb with the library preloaded on the null driver; the script lets the timed loop
# run TRACE_SKIP allocations (default 3000, so every cache and log is warm), then single-steps the next
# allocation and free of the route and prints, per hook call, each instruction with the function gdb names for
# it (inlined bodies keep their own names), then the number of instructions inside libgpureclaim and the jumps
# taken between two of them (a jump to code the compiler laid out of line, and back, costs front-end
# bandwidth that an instruction count does not show).
#
#   LD_LIBRARY_PATH=build/bench/null GPURECLAIM_STATUS=0 TRACE_ROUTE=2 \
#     gdb -q -batch -ex "set environment LD_PRELOAD=$PWD/build/src/libgpureclaim.so" \
#         -x bench/trace_pair.py --args build/bench/bench_hooks --child 100000 2
#
# TRACE_ROUTE and the last argument name the same route (bench_hooks.c: 0 cuMemAlloc_v2 by name, 1 through
# cuGetProcAddress, 2 cuMemAllocAsync by name, 3 through cuGetProcAddress). While gdb steps, gpureclaim's worker
# thread keeps its 4 ms tick, so an allocation may find the tick stopped and take gr_tick_slow (about 15
# instructions with the spills around its call, which a free-running loop pays once per tick): the summary
# gives the count of its own.
import os

import gdb

ROUTES = {0: "cuMemAlloc_v2", 1: "gr_pa_cuMemAlloc_v2", 2: "cuMemAllocAsync", 3: "gr_pa_cuMemAllocAsync"}
route = int(os.environ.get("TRACE_ROUTE", "0"))
skip = int(os.environ.get("TRACE_SKIP", "3000"))

gdb.execute("set pagination off")
gdb.execute("set confirm off")
gdb.execute("break bench_timed_loop")
gdb.execute("run")
gdb.execute("continue")  # the second call is the timed loop (the first warms up)
bp = gdb.Breakpoint(ROUTES[route])
gdb.execute("ignore %d %d" % (bp.number, skip))
gdb.execute("continue")
bp.enabled = False

steps = []  # (pc, function, object, instruction)
calls = 0
while len(steps) < 5000:
    frame = gdb.selected_frame()
    pc = int(frame.pc())
    name = frame.name() or "?"
    obj = os.path.basename(gdb.solib_name(pc) or "main")
    if obj == "main":
        calls += 1
        if calls > 1 and steps and steps[-1][2] != "main":
            break  # back in the loop after the free
    ins = gdb.execute("x/i $pc", to_string=True).split(":", 1)[-1].strip()
    steps.append((pc, name, obj, ins))
    gdb.execute("stepi", to_string=True)
gdb.execute("kill")

# Split at the returns to the loop: one segment per hook call.
segments, cur = [], []
for s in steps:
    if s[2] == "main":
        if cur:
            segments.append(cur)
        cur = []
    else:
        cur.append(s)
if cur:
    segments.append(cur)
for seg in segments:
    print("==== %s" % seg[0][1])
    mine = [s for s in seg if s[2].startswith("libgpureclaim")]
    tick = [s for s in mine if s[1] == "gr_tick_slow"]
    jumps = 0
    for (a, _, oa, _), (b, _, ob, _) in zip(seg, seg[1:]):
        if oa.startswith("libgpureclaim") and ob.startswith("libgpureclaim") and not 1 <= b - a <= 15:
            jumps += 1
    for pc, name, obj, ins in seg:
        print("  %-30s %s" % (name[:30] if obj.startswith("libgpureclaim") else "[" + obj + "]", ins))
    print("  -- %d instructions in libgpureclaim (%d of them gr_tick_slow), %d jumps taken between two of them "
          "(calls into and out of gr_tick_slow included)" % (len(mine), len(tick), jumps))
