#!/usr/bin/env bash
# The pip install: a wheel built offline (pip install --no-build-isolation --no-index, Debian's setuptools and
# wheel) into a fresh venv carries the library and the command, `python -m gpureclaim run -- python3
# examples/train.py` runs the example on the simulator under the wheel's library, and `import gpureclaim` is
# the installed package, naming the library next to it (the one mapped in the process).
# The native parts come from the CTest build (GPURECLAIM_BUILD_DIR, as setup.py allows) so that the test
# takes seconds; setup.py's own CMake build is the same CMake project. The sources are copied first: nothing
# is written into the source tree. Usage: test_wheel.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$(cd "$1" && pwd -P)" src="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# A Python with venv, pip, setuptools and wheel: Debian's (scripts/deps.sh installs them).
py=""
for cand in /usr/bin/python3 python3; do
  if command -v "$cand" >/dev/null &&
     "$cand" -c 'import setuptools, wheel, venv, pip' 2>/dev/null; then py="$(command -v "$cand")"; break; fi
done
[[ -n "$py" ]] || { echo "test_wheel: no python3 with pip, setuptools and wheel (scripts/deps.sh installs python3-pip, python3-setuptools, python3-wheel)"; exit 1; }

mkdir "$tmp/src"
cp -r "$src/setup.py" "$src/pyproject.toml" "$src/CMakeLists.txt" "$src/python" "$tmp/src/"
"$py" -m venv --without-pip --system-site-packages "$tmp/venv"
vpy="$tmp/venv/bin/python"
GPURECLAIM_BUILD_DIR="$build" "$vpy" -m pip install -q --no-cache-dir --no-build-isolation --no-index \
  "$tmp/src" >"$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log"; echo "test_wheel: pip install failed"; exit 1; }

site="$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
pkg="$site/gpureclaim"
for f in __init__.py __main__.py lib/libgpureclaim.so.0 bin/gpureclaim; do
  [[ -f "$pkg/$f" ]] || { echo "test_wheel: the installed package lacks gpureclaim/$f"; exit 1; }
done
[[ -x "$tmp/venv/bin/gpureclaim" ]] || { echo "test_wheel: pip put no gpureclaim script in the venv"; exit 1; }
want="$(sed -n 's/^project(gpureclaim VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")"
for run in "$vpy -m gpureclaim" "$tmp/venv/bin/gpureclaim"; do
  got="$($run --version)"
  [[ "$got" == "gpureclaim $want" ]] || { echo "test_wheel: $run --version printed '$got'"; exit 1; }
done

# The example as the README gives it, from a copy outside the source tree (train.py puts ../python first on
# sys.path, which is then not there: the venv's package is imported).
mkdir -p "$tmp/work/examples"
cp "$src/examples/train.py" "$src/examples/simframework.py" "$tmp/work/examples/"
cat >"$tmp/work/probe.py" <<'PY'
import os, gpureclaim
maps = open("/proc/self/maps").read()
lib = os.path.realpath(gpureclaim.LIBRARY) if gpureclaim.LIBRARY else None
print("package", os.path.dirname(gpureclaim.__file__))
print("library", lib, "mapped" if lib and lib in maps else "NOT MAPPED")
print("version", gpureclaim.version())
PY
export LD_LIBRARY_PATH="$build/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" GPURECLAIM_LOG="$tmp/gpureclaim.log"
unset PYTHONPATH
out="$(cd "$tmp/work" && LD_PRELOAD="${GR_PRELOAD:-}" "$vpy" -m gpureclaim run -- "$vpy" probe.py 2>&1)" ||
  { echo "$out"; echo "test_wheel: the probe failed"; exit 1; }
echo "$out"
[[ "$out" == *"package $pkg"* ]] || { echo "test_wheel: import gpureclaim did not import the installed package"; exit 1; }
[[ "$out" == *"library $(realpath "$pkg/lib/libgpureclaim.so.0") mapped"* ]] ||
  { echo "test_wheel: the wheel's library is not the one mapped in the process"; exit 1; }
[[ "$out" == *"version $want"* ]] || { echo "test_wheel: gpureclaim.version() is not $want"; exit 1; }

out="$(cd "$tmp/work" && LD_PRELOAD="${GR_PRELOAD:-}" "$vpy" -m gpureclaim run -- "$vpy" examples/train.py \
       --steps 2 --width 256 2>&1)" || { echo "$out"; echo "test_wheel: train.py failed"; exit 1; }
echo "$out"
grep -q 'gpureclaim loaded' <<<"$out" || { echo "test_wheel: train.py did not run under gpureclaim"; exit 1; }
grep -Eq 'gpureclaim\.release\(\): [0-9.]+ MiB back' <<<"$out" || { echo "test_wheel: no release in train.py"; exit 1; }
grep -q 'after the release: 0.0 MiB reserved' <<<"$out" || { echo "test_wheel: the release left memory reserved"; exit 1; }
echo "test_wheel: pip install, python -m gpureclaim run, import gpureclaim: ok"
