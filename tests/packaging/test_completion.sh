#!/usr/bin/env bash
# The bash completion (completions/gpureclaim.bash), driven as bash drives it (COMP_WORDS, COMP_CWORD, then
# the function `complete` registered): subcommands, every option the command's --help names, option values,
# and for release/snapshot the pid of a real process running gpureclaim (tests/cli/hold on the simulator),
# never that of a stale status file. The zsh completion is checked for syntax, for loading through compinit,
# and for naming the same options. Usage: test_completion.sh SOURCE_DIR COMMAND HOLD
set -euo pipefail
src="$1" cmd="$2" hold="$3"
comp="$src/completions/gpureclaim.bash"
fail=0
bad() { echo "test_completion: $*"; fail=1; }

# complete WORDS...: the completions offered for the last word (one per line, sorted).
complete_words() {
  bash --norc --noprofile -c '
    source "$1"; shift
    spec="$(complete -p gpureclaim)" || exit 3
    fn="$(sed -n "s/.*-F \([^ ]*\) gpureclaim$/\1/p" <<<"$spec")"
    COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
    "$fn" gpureclaim "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
    printf "%s\n" "${COMPREPLY[@]}"' _ "$comp" "$@" | sort
}
expect() { # expect "WORDS" "expected lines joined by spaces"
  local got
  # shellcheck disable=SC2086
  got="$(complete_words $1 | tr '\n' ' ')"
  [[ "$got" == "$2 " ]] || bad "completing '$1': got '$got', expected '$2'"
}
expect_has() { # the completion of WORDS includes WORD
  local got
  # shellcheck disable=SC2086
  got="$(complete_words $1)"
  grep -qxF -- "$2" <<<"$got" || bad "completing '$1' does not offer '$2' (got: $(tr '\n' ' ' <<<"$got"))"
}

expect "gpureclaim ''" "--help --version ps release run sleep snapshot top wake"
expect "gpureclaim re" "release"
expect "gpureclaim release --w" "--what"
expect "gpureclaim release --what c" "cached"
expect "gpureclaim release --what=cached,o" "cached,orphaned"
expect "gpureclaim run --signal U" "USR1 USR2"
expect "gpureclaim run --on-signal=orphaned,a" "orphaned,all"
expect "gpureclaim run --on-signal=sl" "sleep"
expect "gpureclaim sleep --t" "--timeout"
expect "gpureclaim wake --j" "--json"
expect "gpureclaim snapshot --l" "--leaks"
expect "gpureclaim top --i" "--interval --iterations"
expect "gpureclaim ps --pro" "--prometheus"
expect_has "gpureclaim run --log /tmp/gpureclaim-test-does-not-exist -- bas" "bash"
expect_has "gpureclaim run bas" "bash"
expect_has "gpureclaim run --rundir / bas" "bash"

# Every option that --help names is offered for some subcommand.
help="$("$cmd" --help)"
# The subcommands: the dispatch table of tools/gpureclaim.c ({"run", cmd_run}, ...).
subs="$(grep -o '{"[a-z]*", *cmd_[a-z_]*' "$src/tools/gpureclaim.c" | sed 's/{"\([a-z]*\)".*/\1/' | sort -u)"
(($(wc -w <<<"$subs") >= 5)) || bad "found only '$subs' in tools/gpureclaim.c's table of subcommands"
offered=""
for s in $subs; do offered+=" $(complete_words gpureclaim "$s" -- | tr '\n' ' ')"; done
for o in $(grep -o -- '--[a-z][a-z-]*' <<<"$help" | sort -u); do
  [[ $o == --version ]] && continue
  [[ " $offered " == *" $o "* ]] || bad "no subcommand's completion offers $o"
done
for s in $subs; do
  [[ "$(complete_words gpureclaim '')" == *"$s"* ]] || bad "subcommand $s is not offered"
done

# Pids: a process running gpureclaim is offered; a status file whose process is gone is not.
rundir="$(mktemp -d)"
chmod 700 "$rundir"
fifo="$rundir/in"
mkfifo "$fifo"
out="$rundir/out"
GPURECLAIM_RUNDIR="$rundir" GPURECLAIM_LOG="$rundir/log" "$hold" <"$fifo" >"$out" 2>&1 &
holdpid=$!
exec 9>"$fifo"
trap 'exec 9>&-; wait $holdpid 2>/dev/null; rm -rf "$rundir"' EXIT
for _ in $(seq 1 600); do grep -q '^ready' "$out" && break; sleep 0.05; done
grep -q "^ready $holdpid" "$out" || { echo "test_completion: hold did not start: $(cat "$out")"; exit 1; }
[[ -f "$rundir/$holdpid.json" ]] || { echo "test_completion: hold wrote no status file"; exit 1; }
echo '{}' >"$rundir/4194305.json" # above any pid_max: no such process
got="$(GPURECLAIM_RUNDIR="$rundir" complete_words gpureclaim release '' | tr '\n' ' ')"
[[ "$got" == "$holdpid " ]] || bad "release: offered pids '$got', expected '$holdpid'"
got="$(GPURECLAIM_RUNDIR="$rundir" complete_words gpureclaim snapshot --json '' | tr '\n' ' ')"
[[ "$got" == "$holdpid " ]] || bad "snapshot: offered pids '$got', expected '$holdpid'"
got="$(GPURECLAIM_RUNDIR="$rundir" complete_words gpureclaim ps '' | tr '\n' ' ')" # ps PID... lists those
[[ "$got" == "$holdpid " ]] || bad "ps: offered pids '$got', expected '$holdpid'"
[[ -z "$(GPURECLAIM_RUNDIR="$rundir" complete_words gpureclaim top '')" ]] || bad "top offers pids"
if command -v zsh >/dev/null; then # the zsh function's pid list, _describe replaced by a printer
  got="$(GPURECLAIM_RUNDIR="$rundir" zsh -f -c 'source <(sed "\$d" "$1"); _describe() { print -l -- ${(P)4}; }
         _gpureclaim_pids' _ "$src/completions/_gpureclaim" | cut -d: -f1 | tr '\n' ' ')"
  [[ "$got" == "$holdpid " ]] || bad "zsh: offered pids '$got', expected '$holdpid'"
fi

# zsh: the same options, and the file loads as a completion function.
zcomp="$src/completions/_gpureclaim"
for o in $(grep -o -- '--[a-z][a-z-]*' <<<"$help" | sort -u); do
  grep -qE -- "$o(\\[|=|\\})" "$zcomp" || bad "the zsh completion does not name $o"
done
if command -v zsh >/dev/null; then
  zsh -n "$zcomp" || bad "zsh: syntax error in _gpureclaim"
  got="$(zsh -f -c 'fpath=("$1" $fpath); autoload -Uz compinit; compinit -u -D; print -r -- ${_comps[gpureclaim]}' _ "$src/completions")"
  [[ "$got" == "_gpureclaim" ]] || bad "zsh: compinit did not register _gpureclaim for gpureclaim (got '$got')"
else
  echo "test_completion: zsh is not installed: its completion checked by grep only"
fi

((fail == 0)) || exit 1
echo "test_completion: bash completion of subcommands, options, values and pids ($holdpid) ok; zsh loads"
