#!/usr/bin/env bash
# cmake --install and cpack -G DEB produce a working install: library, header, command, Python helper,
# pkg-config file and CMake package, usable by a consumer project. Usage: test_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1" src="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
libdir="$(cd "$prefix" && dirname "$(find lib* -name libgpureclaim.so.0 | head -1)")" # lib, lib64, lib/<triplet>
for f in bin/gpureclaim "$libdir/libgpureclaim.so.0" "$libdir/libgpureclaim.so" include/gpureclaim.h \
         "$libdir/pkgconfig/gpureclaim.pc" "$libdir/cmake/gpureclaim/gpureclaimConfig.cmake" \
         "$libdir/cmake/gpureclaim/gpureclaimConfigVersion.cmake" share/gpureclaim/python/gpureclaim/__init__.py; do
  [[ -e "$prefix/$f" ]] || { echo "test_install: missing $f"; exit 1; }
done
flags="$(PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig" pkg-config --cflags --libs gpureclaim)"
inc="$(PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig" pkg-config --variable=includedir gpureclaim)"
[[ "$(cd "$inc" && pwd -P)" == "$(cd "$prefix/include" && pwd -P)" && "$flags" == *"-lgpureclaim"* ]] ||
  { echo "test_install: pkg-config: $flags"; exit 1; }

# A consumer project with find_package(gpureclaim).
mkdir -p "$tmp/consumer"
cat > "$tmp/consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(consumer C)
find_package(gpureclaim 0.1 REQUIRED)
add_executable(consumer main.c)
target_link_libraries(consumer PRIVATE gpureclaim::gpureclaim)
CM
cat > "$tmp/consumer/main.c" <<'C'
#include <gpureclaim.h>
#include <stdio.h>
int main(void) { printf("consumer linked gpureclaim %s\n", gpureclaim_version()); return 0; }
C
cmake -S "$tmp/consumer" -B "$tmp/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/consumer/build" >/dev/null
out="$(LD_PRELOAD="${GR_PRELOAD:-}" LD_LIBRARY_PATH="$prefix/$libdir" "$tmp/consumer/build/consumer")"
[[ "$out" == "consumer linked gpureclaim 0.1.0" ]] || { echo "test_install: consumer printed: $out"; exit 1; }

# A consumer built with nothing but pkg-config's flags.
if command -v cc >/dev/null; then
  # shellcheck disable=SC2086
  cc -o "$tmp/pcconsumer" "$tmp/consumer/main.c" $(PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig" pkg-config --cflags --libs gpureclaim)
  out="$(LD_PRELOAD="${GR_PRELOAD:-}" LD_LIBRARY_PATH="$prefix/$libdir" "$tmp/pcconsumer")"
  [[ "$out" == "consumer linked gpureclaim 0.1.0" ]] || { echo "test_install: pkg-config consumer printed: $out"; exit 1; }
  # A private prefix: the program finds the library by itself with the rpath the .pc file and docs/INSTALL.md
  # say to add (without one it needs LD_LIBRARY_PATH).
  export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig"
  # shellcheck disable=SC2046
  cc -o "$tmp/rpconsumer" "$tmp/consumer/main.c" $(pkg-config --cflags --libs gpureclaim) \
    -Wl,-rpath,"$(pkg-config --variable=libdir gpureclaim)"
  unset PKG_CONFIG_PATH
  out="$(env -u LD_LIBRARY_PATH LD_PRELOAD="${GR_PRELOAD:-}" "$tmp/rpconsumer")"
  [[ "$out" == "consumer linked gpureclaim 0.1.0" ]] || { echo "test_install: the rpath consumer printed: $out"; exit 1; }
  grep -q -- '-Wl,-rpath,$(pkg-config --variable=libdir gpureclaim)' "$prefix/$libdir/pkgconfig/gpureclaim.pc" ||
    { echo "test_install: the .pc file does not say how to link against a private prefix"; exit 1; }
fi

# The installed command finds the installed library (by its soname) and the loader maps it.
lib="$(cd "$prefix/$libdir" && pwd -P)/libgpureclaim.so.0"
pre="$(LD_PRELOAD="${GR_PRELOAD:-}" "$prefix/bin/gpureclaim" run -- sh -c 'echo "$LD_PRELOAD"')"
[[ ":$pre:" == *":$lib:"* ]] || { echo "test_install: run preloads $pre"; exit 1; }
maps="$(LD_PRELOAD="${GR_PRELOAD:-}" "$prefix/bin/gpureclaim" run -- sh -c 'cat /proc/$$/maps')"
[[ "$maps" == *"$(cd "$prefix/$libdir" && pwd -P)/libgpureclaim.so.0.1.0"* ]] ||
  { echo "test_install: the installed library is not mapped in a program started with run"; exit 1; }

# ... in a program on the simulator: the demo, through the installed command, library and Python helper.
sim="$build/sim"
if [[ -x "$build/examples/demo" ]]; then
  out="$(LD_PRELOAD="${GR_PRELOAD:-}" LD_LIBRARY_PATH="$sim" GPURECLAIM_RUNDIR="$tmp/run" GPURECLAIM_LOG="$tmp/demo.log" \
         "$prefix/bin/gpureclaim" run -- "$build/examples/demo")"
  [[ "$out" == *"gpureclaim_release: 1536.0 MiB back"* ]] || { echo "test_install: demo printed: $out"; exit 1; }
fi
if command -v python3 >/dev/null; then
  out="$(LD_PRELOAD="${GR_PRELOAD:-}" PYTHONPATH="$prefix/share/gpureclaim/python" GPURECLAIM_STATUS=0 \
         "$prefix/bin/gpureclaim" run -- python3 -c 'import gpureclaim; print("helper", gpureclaim.version())')"
  [[ "$out" == "helper 0.1.0" ]] || { echo "test_install: the installed Python helper printed: $out"; exit 1; }
fi

# A Debian package of the same.
if command -v dpkg-deb >/dev/null; then
  (cd "$tmp" && cpack --config "$build/CPackConfig.cmake" -G DEB -B "$tmp" >/dev/null) # build/package is test_deb's
  deb="$(ls "$tmp"/*.deb)"
  contents="$(dpkg-deb -c "$deb")"
  for f in bin/gpureclaim include/gpureclaim.h libgpureclaim.so.0 pkgconfig/gpureclaim.pc \
           cmake/gpureclaim/gpureclaimConfig.cmake share/gpureclaim/python/gpureclaim/__init__.py; do
    [[ "$contents" == *"$f"* ]] || { echo "test_install: $deb lacks $f"; exit 1; }
  done
  echo "test_install: $(basename "$deb") ok"
fi
echo "test_install: install, pkg-config, find_package, the command: ok"
