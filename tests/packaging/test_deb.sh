#!/usr/bin/env bash
# The Debian package: `cpack -G DEB`, run from an unrelated directory, writes only under the build directory
# (build/package/), and lintian finds no error in the package or in its -dbgsym package. Also checks what
# lintian's tags stand for, directly: the multiarch library directory, an ldconfig trigger, a shlibs file,
# stripped binaries whose debug information is in the -dbgsym package (found by build id), gzipped man pages,
# copyright and changelog; and that the packaged command preloads the packaged library. A build whose type
# compiles no debug information (Release: the build tree's library has no .debug_info) gets no -dbgsym package,
# and its binaries are stripped all the same. Usage: test_deb.sh BUILD_DIR
set -euo pipefail
build="$(cd "$1" && pwd -P)"
for tool in cpack dpkg-deb dpkg-shlibdeps lintian readelf file; do
  command -v "$tool" >/dev/null || { echo "test_deb: $tool is not installed (scripts/deps.sh installs it)"; exit 1; }
done
fail=0
bad() { echo "test_deb: $*"; fail=1; }

cwd="$(mktemp -d)"
trap 'rm -rf "$cwd"' EXIT
rm -rf "$build/package"
(cd "$cwd" && cpack --config "$build/CPackConfig.cmake" -G DEB >"$build/cpack.log" 2>&1) ||
  { cat "$build/cpack.log"; echo "test_deb: cpack failed"; exit 1; }
[[ -z "$(ls -A "$cwd")" ]] || bad "cpack wrote into the directory it ran in: $(ls -A "$cwd")"
deb="$(ls "$build"/package/gpureclaim_*.deb)"
# What the package must hold follows from the build: debug information in the build tree's library (as built,
# before any strip) means a -dbgsym package that has it.
built="$(find "$build/src" -maxdepth 1 -name 'libgpureclaim.so.*.*.*' | head -1)"
[[ -n "$built" ]] || { echo "test_deb: no libgpureclaim.so.X.Y.Z in $build/src"; exit 1; }
ddeb="$(ls "$build"/package/gpureclaim-dbgsym_*.ddeb 2>/dev/null || true)"
if [[ "$(readelf -S "$built")" == *" .debug_info "* ]]; then
  [[ -n "$ddeb" ]] || { echo "test_deb: the build has debug information, but cpack made no -dbgsym package"; exit 1; }
else
  [[ -z "$ddeb" ]] || bad "the build has no debug information, but cpack made a -dbgsym package: $ddeb"
  ddeb=""
fi

# lintian: no error (E:) in either; warnings are printed.
lint="$(lintian --tag-display-limit 0 "$deb" ${ddeb:+"$ddeb"} 2>&1 | grep -v 'running with root privileges' || true)"
[[ -n "$lint" ]] && echo "$lint"
grep -q '^E:' <<<"$lint" && bad "lintian reports errors"

arch="$(dpkg-deb -f "$deb" Architecture)"
triplet="$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)"
contents="$(dpkg-deb -c "$deb")"
for f in "usr/lib/$triplet/libgpureclaim.so.0.1.0" "usr/lib/$triplet/pkgconfig/gpureclaim.pc" usr/bin/gpureclaim \
         usr/share/man/man1/gpureclaim.1.gz usr/share/man/man3/gpureclaim.3.gz usr/share/man/man7/gpureclaim.7.gz \
         usr/share/doc/gpureclaim/copyright usr/share/doc/gpureclaim/changelog.gz \
         usr/share/bash-completion/completions/gpureclaim usr/share/zsh/vendor-completions/_gpureclaim \
         usr/include/gpureclaim.h; do
  grep -q " \./$f\( \|$\)" <<<"$contents" || bad "$(basename "$deb") lacks $f"
done
grep -q ' \./usr/share/man/man3/gpureclaim_release\.3\.gz -> gpureclaim\.3\.gz$' <<<"$contents" ||
  bad "no man page link for gpureclaim_release(3)"
ctrl="$(mktemp -d -p "$cwd")"
dpkg-deb -e "$deb" "$ctrl"
grep -qx 'activate-noawait ldconfig' "$ctrl/triggers" 2>/dev/null || bad "no ldconfig trigger"
grep -q '^libgpureclaim 0 gpureclaim' "$ctrl/shlibs" 2>/dev/null || bad "no shlibs entry for libgpureclaim.so.0"
grep -q '^Depends:.*libc6' "$ctrl/control" || bad "Depends lacks libc6 (dpkg-shlibdeps)"

# Stripped binaries, each with its debug information in the dbgsym package under its build id.
root="$(mktemp -d -p "$cwd")" dbg="$(mktemp -d -p "$cwd")"
dpkg-deb -x "$deb" "$root"
[[ -z "$ddeb" ]] || dpkg-deb -x "$ddeb" "$dbg"
version="$(dpkg-deb -f "$deb" Version)"
top="$(zcat "$root/usr/share/doc/gpureclaim/changelog.gz" | head -1)" || true
[[ "$top" == "gpureclaim ($version) "* ]] ||
  bad "cmake/debian/changelog's first entry is not version $version (the project's): $top"
for bin in usr/bin/gpureclaim "usr/lib/$triplet/libgpureclaim.so.0.1.0"; do
  # (grep -q on a variable: on a pipe it may exit first, and pipefail would take the writer's SIGPIPE for a failure)
  [[ "$(file -b "$root/$bin")" == *", stripped"* ]] || bad "$bin is not stripped"
  [[ -n "$ddeb" ]] || continue
  id="$(readelf -n "$root/$bin" | sed -n 's/.*Build ID: \([0-9a-f]*\).*/\1/p')"
  debug="$dbg/usr/lib/debug/.build-id/${id:0:2}/${id:2}.debug"
  [[ -n "$id" && -f "$debug" ]] || { bad "$bin: no debug file for build id '$id' in the dbgsym package"; continue; }
  [[ "$(readelf -S "$debug" 2>/dev/null)" == *" .debug_info "* ]] || bad "$bin: its debug file has no .debug_info"
done
# The packaged command finds the packaged library (next to it, in the multiarch directory), and the stripped
# library loads.
lib="$root/usr/lib/$triplet/libgpureclaim.so.0"
maps="$(LD_PRELOAD="${GR_PRELOAD:-}" "$root/usr/bin/gpureclaim" run -- sh -c 'echo "LD_PRELOAD=$LD_PRELOAD"; cat /proc/$$/maps')" ||
  bad "the packaged command's run failed: $maps"
[[ "$maps" == *"LD_PRELOAD="*"$lib"* ]] || bad "the packaged command does not preload $lib: $(head -1 <<<"$maps")"
[[ "$maps" == *"$root/usr/lib/$triplet/libgpureclaim.so.0.1.0"* ]] || bad "the packaged library is not mapped"

((fail == 0)) || exit 1
echo "test_deb: $(basename "$deb")${ddeb:+ and $(basename "$ddeb")} ($arch) pass lintian without errors"
