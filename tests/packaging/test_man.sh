#!/usr/bin/env bash
# The man pages (docs/man/) render without a warning and cannot drift from the code: gpureclaim(7) documents
# every GPURECLAIM_* variable that src/base/options.h lists (and those the command reads), gpureclaim(3) every
# function include/gpureclaim.h declares, gpureclaim(1) every subcommand and every option the command's --help
# names. Usage: test_man.sh SOURCE_DIR COMMAND
set -euo pipefail
src="$1" cmd="$2"
man="$src/docs/man"
fail=0
bad() { echo "test_man: $*"; fail=1; }

command -v groff >/dev/null || { echo "test_man: groff is not installed (scripts/deps.sh installs groff-base)"; exit 1; }
for page in gpureclaim.1 gpureclaim.3 gpureclaim.7; do
  [[ -f "$man/$page" ]] || { bad "missing docs/man/$page"; continue; }
  # -ww: every warning; -z: no output, only diagnostics. Any diagnostic fails.
  warn="$(groff -man -Tutf8 -ww -z "$man/$page" 2>&1)" || bad "$page: groff failed"
  [[ -z "$warn" ]] || bad "$page: groff warns: $warn"
  text="$(MANWIDTH=80 groff -man -Tutf8 -ww "$man/$page" 2>/dev/null | sed 's/.\x08//g')"
  [[ "$text" == *NAME* && "$text" == *"SEE ALSO"* ]] || bad "$page: rendered without NAME or SEE ALSO"
  if command -v man >/dev/null; then
    warn="$(MANWIDTH=80 man --warnings=w -l "$man/$page" 2>&1 >/dev/null)" || bad "$page: man -l failed"
    [[ -z "$warn" ]] || bad "$page: man -l warns: $warn"
  fi
done

# Each page names the project's version (CMakeLists.txt) in its .TH line.
version="$(sed -n 's/^project(gpureclaim VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")"
for page in gpureclaim.1 gpureclaim.3 gpureclaim.7; do
  grep -q "^\.TH GPURECLAIM [137] [0-9-]* \"gpureclaim $version\"" "$man/$page" ||
    bad "$page: its .TH line does not name gpureclaim $version"
done

# gpureclaim(7): each variable gets its own .B entry (tagged paragraph). The list comes from the option list
# of src/base/options.h (X(ID, ...) for GPURECLAIM_ID) and the command's own getenv calls.
vars="$( (grep -o '^ *X([A-Z_]*,' "$src/src/base/options.h" | sed 's/^ *X(/GPURECLAIM_/; s/,$//'
          grep -oh 'getenv("GPURECLAIM_[A-Z_]*"' "$src"/tools/*.c | sed 's/getenv("//; s/"//') | sort -u)"
nvars=$(wc -w <<<"$vars")
((nvars >= 10)) || bad "found only $nvars variables in src/base/options.h: did its list change shape?"
for v in $vars; do
  grep -qx "\.B $v" "$man/gpureclaim.7" || bad "gpureclaim.7 does not document $v (add a .TP/.B $v entry)"
done

# gpureclaim(3): each public function in NAME, in SYNOPSIS and described as .BR name ().
funcs="$(grep -o 'GPURECLAIM_API [^(]*(' "$src/include/gpureclaim.h" | grep -o 'gpureclaim_[a-z_]*(' | tr -d '(' | sort -u)"
nfuncs=$(wc -w <<<"$funcs")
((nfuncs >= 10)) || bad "found only $nfuncs functions in include/gpureclaim.h"
name_section="$(sed -n '/^\.SH NAME/,/^\.SH/p' "$man/gpureclaim.3")"
for f in $funcs; do
  grep -qw "$f" <<<"$name_section" || bad "gpureclaim.3: $f missing from NAME"
  grep -q "$f(" "$man/gpureclaim.3" || bad "gpureclaim.3: $f missing from SYNOPSIS"
  grep -qx "\.BR $f ()" "$man/gpureclaim.3" || bad "gpureclaim.3: $f is not described (.BR $f ())"
done

# gpureclaim(1): each subcommand has an entry, each option the --help output names appears.
help="$("$cmd" --help)"
# The subcommands: the dispatch table of tools/gpureclaim.c ({"run", cmd_run}, ...).
subs="$(grep -o '{"[a-z]*", *cmd_[a-z_]*' "$src/tools/gpureclaim.c" | sed 's/{"\([a-z]*\)".*/\1/' | sort -u)"
(($(wc -w <<<"$subs") >= 5)) || bad "found only '$subs' in tools/gpureclaim.c's table of subcommands"
opts=""
for s in $subs; do
  grep -q "^\.B\(R\|I\)\? $s\b" "$man/gpureclaim.1" || bad "gpureclaim.1 has no entry for the subcommand $s"
  opts+=" $( { "$cmd" "$s" --help 2>/dev/null || true; } | grep -o -- '--[a-z][a-z-]*' || true)"
done
opts="$(tr ' ' '\n' <<<"$opts $(grep -o -- '--[a-z][a-z-]*' <<<"$help")" | sort -u | grep . || true)"
nopts=$(wc -w <<<"$opts")
((nopts >= 15)) || bad "found only $nopts options in gpureclaim --help"
for o in $opts; do
  grep -q -- "${o//-/\\\\-}\b" "$man/gpureclaim.1" || bad "gpureclaim.1 does not mention $o"
done

((fail == 0)) || exit 1
echo "test_man: 3 pages render without warnings; $nvars variables, $nfuncs functions, $(wc -w <<<"$subs") subcommands, $nopts options documented"
