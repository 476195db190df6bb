#!/usr/bin/env bash
# test_readme.sh BUILD_DIR SOURCE_DIR: runs README.md's newcomer block (between <!-- newcomer:begin --> and
# <!-- newcomer:end -->) exactly as printed, with bash -e, in a directory laid out as a fresh clone: scripts/,
# examples/ and python/ of the source tree, and build/ standing for the build directory of this test run. The
# block's set-up steps run for real (scripts/deps.sh finds everything there), except the build itself: this
# run's build directory is already built, so `cmake` is a stand-in on PATH that checks it is called as the
# block calls it, and does nothing. Everything after runs the real command on the simulator (no GPU here; with
# one, the block's own nvidia-smi line keeps the real driver). LD_LIBRARY_PATH and PATH are the user's: the
# block must set what it needs.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
readme="$src/README.md"

block=$(sed -n '/^<!-- newcomer:begin -->$/,/^<!-- newcomer:end -->$/p' "$readme" | sed '1,2d;$d' | sed '$d')
[[ -n "$block" ]] || { echo "test_readme: no newcomer block in $readme"; exit 1; }
# The fences: the block is one sh code block.
[[ $(sed -n '/^<!-- newcomer:begin -->$/{n;p;}' "$readme") == '```sh' ]] || { echo "no \`\`\`sh after the marker"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
clone="$tmp/gpureclaim"
mkdir -p "$clone" "$tmp/bin"
for d in scripts examples python; do ln -s "$src/$d" "$clone/$d"; done
ln -s "$build" "$clone/build"
cat >"$tmp/bin/cmake" <<'EOF'
#!/bin/sh
# A stand-in for cmake: the build directory is this test run's, already built.
case "$*" in
"-S . -B build") echo "(cmake -S . -B build: this run's build directory, already configured)" ;;
"--build build -j"[0-9]*) echo "(cmake --build build: already built)" ;;
*) echo "cmake stand-in: unexpected arguments: $*" >&2; exit 1 ;;
esac
EOF
chmod +x "$tmp/bin/cmake"
printf '%s\n' "$block" >"$tmp/block.sh"
echo "== README.md's newcomer block:"
cat "$tmp/block.sh"
echo "== running it"
cd "$clone"
set +e
out=$(env -u LD_LIBRARY_PATH PATH="$tmp/bin:$PATH" bash -e "$tmp/block.sh" 2>&1)
rc=$?
set -e
printf '%s\n' "$out"
[[ $rc -eq 0 ]] || { echo "test_readme: the block failed (exit $rc)"; exit 1; }
# What the block promises: the process listed, its snapshot, its release, and model 2 after it.
grep -Eq '^ +[0-9]+ [0-9,?-]+ .* python3 train\.py --wait' <<<"$out" || { echo "test_readme: ps did not list train.py"; exit 1; }
grep -q 'live blocks' <<<"$out" || { echo "test_readme: no snapshot"; exit 1; }
grep -Eq '^[0-9]+ \(python3 .*\): released [0-9.]+ MiB in' <<<"$out" || { echo "test_readme: no release report"; exit 1; }
grep -q 'after the release: 0.0 MiB reserved' <<<"$out" || { echo "test_readme: the cache did not come back"; exit 1; }
grep -q '^model 2' <<<"$out" || { echo "test_readme: model 2 did not run"; exit 1; }
if grep -q '"event"' <<<"$out"; then echo "test_readme: a JSON report on the program's output"; exit 1; fi
# What the block leaves in the repository's root (train.log) is ignored by git: a newcomer's checkout stays clean.
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  for f in "$clone"/*; do
    [[ -L "$f" ]] && continue
    git -C "$src" check-ignore -q --no-index "$(basename "$f")" ||
      { echo "test_readme: the block leaves $(basename "$f") in the checkout, not in .gitignore"; exit 1; }
  done
fi
echo "test_readme: the newcomer block works as printed"
