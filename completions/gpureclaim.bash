# bash completion for gpureclaim(1): subcommands, their options and option values, and for release and
# snapshot the pids of your processes running gpureclaim (from the run directory's status files, as the command
# finds them). Installed as <datadir>/bash-completion/completions/gpureclaim; works without the
# bash-completion package too (source it).

# Pids with a status file in the run directory whose process still exists.
_gpureclaim_pids() {
  local dir="${GPURECLAIM_RUNDIR:-}" f pid
  if [[ -z $dir ]]; then
    if [[ -n ${XDG_RUNTIME_DIR:-} && -O ${XDG_RUNTIME_DIR} ]]; then
      dir="$XDG_RUNTIME_DIR/gpureclaim"
    else
      dir="/tmp/gpureclaim-${EUID}"
    fi
  fi
  [[ -d $dir ]] || return 0
  for f in "$dir"/*.json; do
    pid="${f##*/}"
    pid="${pid%.json}"
    [[ $pid =~ ^[0-9]+$ && -d /proc/$pid ]] && printf '%s\n' "$pid"
  done
}

_gpureclaim() {
  local cur="${COMP_WORDS[COMP_CWORD]}" prev="" sub="" i w
  ((COMP_CWORD > 0)) && prev="${COMP_WORDS[COMP_CWORD - 1]}"
  COMPREPLY=()
  local subs="run ps release snapshot sleep wake top"

  # The subcommand is the first word after the command name.
  if ((COMP_CWORD == 1)); then
    mapfile -t COMPREPLY < <(compgen -W "$subs --help --version" -- "$cur")
    return 0
  fi
  sub="${COMP_WORDS[1]}"

  local opts="" valued=""
  case $sub in
  run)
    # run's own options end at "--" or at the program; after that, complete the program, then its arguments.
    for ((i = 2; i < COMP_CWORD; i++)); do
      w="${COMP_WORDS[i]}"
      if [[ $w == -- ]] || [[ $w != -* && " --signal --on-signal --oom-retry --log --rundir --peers --peer-timeout " != *" ${COMP_WORDS[i - 1]} "* ]]; then
        if [[ $w == -- ]]; then ((i++)); fi
        if ((i >= COMP_CWORD)); then
          mapfile -t COMPREPLY < <(compgen -c -- "$cur")
        elif declare -F _command_offset >/dev/null; then
          _command_offset "$i"
        else
          mapfile -t COMPREPLY < <(compgen -f -- "$cur")
        fi
        return 0
      fi
    done
    opts="--signal --on-signal --oom-retry --log --rundir --peers --peer-timeout --leak-report --backtrace --verbose --verbose= --no-status --disable --help"
    valued="--signal --on-signal --oom-retry --log --rundir --peers --peer-timeout"
    if [[ $cur != -* && " $valued " != *" $prev "* ]]; then # the program itself
      mapfile -t COMPREPLY < <(compgen -c -- "$cur")
      return 0
    fi
    ;;
  ps) opts="--gpu --sort --json --query --format --prometheus --label --loop --help" valued="--gpu --sort --query --format --prometheus --label --loop" ;;
  release) opts="--all --gpu --what --timeout --signal --json --tree --help" valued="--gpu --what --timeout" ;;
  snapshot) opts="--json --leaks --timeout --help" valued="--timeout" ;;
  sleep | wake) opts="--timeout --json --help" valued="--timeout" ;;
  top) opts="--interval --iterations --gpu --sort --json --help" valued="--interval --iterations --gpu --sort" ;;
  *) return 0 ;;
  esac

  # --option=value: complete the value after the "=".
  local opt="" val="$cur"
  if [[ $cur == --*=* ]]; then
    opt="${cur%%=*}" val="${cur#*=}"
  elif [[ " $valued " == *" $prev "* ]]; then
    opt="$prev"
  fi
  if [[ -n $opt ]]; then
    case $sub:$opt in
    run:--signal) mapfile -t COMPREPLY < <(compgen -W "USR1 USR2 RTMIN+1 RTMIN+2 off" -- "$val") ;;
    run:--peers) mapfile -t COMPREPLY < <(compgen -W "ask,give ask,give,sleep ask give off" -- "$val") ;;
    run:--on-signal | release:--what)
      # A comma-separated list: complete the last item.
      local head="" last="$val"
      [[ $val == *,* ]] && head="${val%,*}," last="${val##*,}"
      local words="cached orphaned all"
      [[ $sub == run && -z $head ]] && words="$words sleep"
      mapfile -t COMPREPLY < <(compgen -P "$head" -W "$words" -- "$last")
      ;;
    run:--log | ps:--prometheus) mapfile -t COMPREPLY < <(compgen -f -- "$val") ;;
    ps:--sort | top:--sort)
      mapfile -t COMPREPLY < <(compgen -W "held cached releasable orphan live pinned releases pid command gpu" -- "$val") ;;
    ps:--format) mapfile -t COMPREPLY < <(compgen -W "table csv csv,noheader csv,noheader,nounits json" -- "$val") ;;
    run:--rundir) mapfile -t COMPREPLY < <(compgen -d -- "$val") ;;
    run:--verbose) mapfile -t COMPREPLY < <(compgen -W "0 1 2" -- "$val") ;;
    *) ;; # a number: nothing to offer
    esac
    return 0
  fi

  if [[ $cur == -* ]]; then
    mapfile -t COMPREPLY < <(compgen -W "$opts" -- "$cur")
    [[ ${COMPREPLY[*]} == *= ]] && compopt -o nospace 2>/dev/null
    return 0
  fi
  case $sub in
  ps | release | snapshot | sleep | wake) mapfile -t COMPREPLY < <(compgen -W "$(_gpureclaim_pids)" -- "$cur") ;;
  esac
  return 0
}
complete -F _gpureclaim gpureclaim
