#!/usr/bin/env bash
# test_layers.sh SRC_ROOT: the house's layers hold (scripts/check_layers.sh passes on the tree), and the check can
# fail: on a copy of the tree in this test's run directory it must refuse an upward include, a circle between two
# modules of one layer, and a command file that reads a library header, each named in its output.
set -u
root=$1
check="$root/scripts/check_layers.sh"
fail() { echo "test_layers: $*"; exit 1; }
out="$("$check" "$root")" || fail "the tree breaks its layers:"$'\n'"$out"
echo "$out"
[[ $out =~ ([0-9]+)\ modules.*\ ([0-9]+)\ edges ]] || fail "no figures in: $out"
((BASH_REMATCH[1] >= 40 && BASH_REMATCH[2] >= 100)) || fail "checked too little (${BASH_REMATCH[1]} modules, ${BASH_REMATCH[2]} edges): did it find the sources?"

copy() { rm -rf tree && mkdir tree && cp -r "$root/src" "$root/tools" "$root/scripts" tree/; }
expect_refused() { # WHAT PATTERN
  local got
  if got="$(tree/scripts/check_layers.sh "$PWD/tree")"; then fail "$1 passed the check:"$'\n'"$got"; fi
  grep -q -- "$2" <<<"$got" || fail "$1: refused without naming it ($2):"$'\n'"$got"
  echo "refused, as it must: $1"
}
copy; echo '#include "sleep.h"' >>tree/src/track/stats.c
expect_refused "track/stats.c including release/sleep.h" "upward include: src/track/stats.c includes sleep.h"
copy; echo '#include "track.h"' >>tree/src/track/stats.h
expect_refused "a circle stats -> track -> stats" "include circle"
copy; echo '#include "state.h"' >>tree/tools/cmd_ps.c
expect_refused "tools/cmd_ps.c including proc/state.h" "tools/cmd_ps.c includes state.h of src/proc/"
copy; echo '#include "nosuch.h"' >>tree/src/proc/tick.c
expect_refused "an include of a header that does not exist" "no header of src/"
rm -rf tree
