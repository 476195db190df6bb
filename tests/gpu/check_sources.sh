#!/usr/bin/env bash
# The GPU programs and scripts, checked without a GPU (CTest: gpu_sources): every .cu of tests/gpu/ and
# bench/gpu/ compiles (nvcc when there is one, else the host C++ compiler: they hold no kernels, only runtime
# and driver API calls), the C probes compile, the shell scripts parse and the Python files compile. A stale
# include or a typo in code that only a GPU machine runs then fails here, not after the machine was started.
#
#   tests/gpu/check_sources.sh SOURCE_DIR CUDA_INCLUDE_DIR OUT_DIR
set -uo pipefail
src=$1 cuda_inc=$2 out=$3
mkdir -p "$out"
failed=0 n=0
check() { # check WHAT CMD...: runs CMD, prints its output on failure
  local what=$1; shift
  n=$((n + 1))
  if ! "$@" >"$out/log" 2>&1; then
    echo "FAIL $what: $*"; sed 's/^/    /' "$out/log"; failed=1
  fi
}
cxx=""
if command -v nvcc >/dev/null 2>&1; then cxx=nvcc
elif [[ -x /usr/local/cuda/bin/nvcc ]]; then cxx=/usr/local/cuda/bin/nvcc
elif command -v c++ >/dev/null 2>&1; then cxx=c++
fi
if [[ -z $cxx ]]; then
  echo "gpu_sources: skipped: neither nvcc nor a C++ compiler (c++) is installed"
  exit 77
fi
for f in "$src"/tests/gpu/*.cu "$src"/bench/gpu/*.cu; do
  if [[ $cxx == *nvcc ]]; then
    check "$f" "$cxx" -std=c++17 -I"$src/include" -c "$f" -o "$out/x.o"
  else
    check "$f" "$cxx" -std=c++17 -fsyntax-only -Wall -x c++ -I"$src/include" -I"$cuda_inc" "$f"
  fi
done
for f in "$src"/tests/gpu/*.c; do
  check "$f" cc -std=gnu11 -fsyntax-only -Wall -Wextra -I"$src/include" -I"$cuda_inc" "$f"
done
for f in "$src"/tests/gpu/*.sh "$src"/tests/cli/examples_gpu.sh; do check "$f" bash -n "$f"; done
for f in "$src"/tests/gpu/*.py; do
  check "$f" python3 -c 'import ast, sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])' "$f"
done
echo "gpu_sources: $n files checked with $cxx, cc, bash -n and python3$([[ $failed == 0 ]] && echo ', all good')"
exit $failed
