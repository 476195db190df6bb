#!/usr/bin/env bash
# check_layers.sh [ROOT] -- the house's two rules, checked over the #include lines of ROOT (the source tree, by
# default the one this script is in):
#   1. a file of src/LAYER/ includes only headers of its own layer, of base/, and of the layers LAYER sees, as
#      src/CMakeLists.txt lists them (GPURECLAIM_LAYER_SEES_*): the same lists the build gives each layer as its
#      include path, so the build refuses what this reports; tools/ includes only base/ and the public header;
#   2. no circle between modules (a module is NAME.c with NAME.h; A includes B when A.c or A.h includes B.h),
#      found with tsort.
# Prints each breach and exits 1, or prints what it checked and exits 0. Needs bash, grep, sed, sort, tsort.
set -u
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
src="$root/src"
cmake="$src/CMakeLists.txt"
[[ -f $cmake ]] || { echo "check_layers: no $cmake (give the source tree as the argument)" >&2; exit 2; }

layers="$(sed -n 's/^set(GPURECLAIM_LAYERS \(.*\))$/\1/p' "$cmake")"
[[ -n $layers ]] || { echo "check_layers: no set(GPURECLAIM_LAYERS ...) line in $cmake" >&2; exit 2; }
declare -A sees layer_of_header
for l in $layers; do
  sees[$l]="$l base $(sed -n "s/^set(GPURECLAIM_LAYER_SEES_$l *\(.*\))$/\1/p" "$cmake")"
done
sees[base]="base"

# Every header of src/, by name: a name must be unique, or "include NAME" would depend on the include path's order.
bad=0
for l in base $layers; do
  for h in "$src/$l"/*.h; do
    [[ -e $h ]] || continue
    n="${h##*/}"
    if [[ -n ${layer_of_header[$n]:-} ]]; then
      echo "two headers named $n: src/${layer_of_header[$n]}/$n and src/$l/$n"; bad=1
    fi
    layer_of_header[$n]=$l
  done
done

edges=0 includes=0
graph="$(mktemp)"
trap 'rm -f "$graph"' EXIT
for l in base $layers; do
  for f in "$src/$l"/*.c "$src/$l"/*.h "$src/$l"/*.S; do
    [[ -e $f ]] || continue
    base="${f##*/}"; mod="$l/${base%.*}"
    echo "$mod $mod" >>"$graph" # every module is a node, even one that includes nothing
    while read -r inc; do
      includes=$((includes + 1))
      to="${layer_of_header[$inc]:-}"
      if [[ -z $to ]]; then
        [[ $inc == gpureclaim.h ]] && continue # the public header, visible to every layer
        [[ -e "$src/$l/$inc" ]] && continue    # a non-header file of the same folder (none today)
        echo "src/$l/$base includes \"$inc\", which is no header of src/"; bad=1; continue
      fi
      if [[ " ${sees[$l]} " != *" $to "* ]]; then
        echo "upward include: src/$l/$base includes $inc of src/$to/ (layer $l sees only: ${sees[$l]})"; bad=1
      fi
      target="$to/${inc%.h}"
      if [[ $target != "$mod" ]]; then
        echo "$mod $target" >>"$graph"; edges=$((edges + 1))
      fi
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
  done
done

# tools/: the command links only base/ (gpureclaim_common) and reads the public header.
for f in "$root"/tools/*.c "$root"/tools/*.h; do
  [[ -e $f ]] || continue
  while read -r inc; do
    includes=$((includes + 1))
    [[ -e "$root/tools/$inc" || $inc == gpureclaim.h ]] && continue
    to="${layer_of_header[$inc]:-}"
    if [[ $to != base ]]; then
      echo "tools/${f##*/} includes $inc${to:+ of src/$to/}: the command sees only src/base/ and include/"; bad=1
    fi
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
done

# A circle: tsort names the modules on it (on stderr, one per line after "input contains a loop").
if ! loops="$(tsort "$graph" 2>&1 >/dev/null)"; then
  echo "include circle between modules:"; echo "$loops" | sed 's/^tsort: [^:]*: //'; bad=1
fi
nodes="$(cut -d' ' -f1 "$graph" | sort -u | wc -l)"
if ((bad)); then
  echo "check_layers: the layers are broken (rules in docs/ARCHITECTURE.md)"; exit 1
fi
echo "check_layers: $nodes modules in $(wc -w <<<"base $layers") layers, $includes includes, $edges edges between" \
  "modules: no upward include, no circle"
