#!/bin/sh
# inference_usage.sh INFERENCE ERRFILE -- the inference example takes its argument strictly: a usage message and
# exit 2 for anything but a count (atoi made "--help" zero loads and a success); --help is not an error. A CUDA
# failure (a device too small) is named by CUDA's own string.
prog=$1 err=$2
for a in 0 ten 12x -3 '' 1e3 2000000; do
  "$prog" "$a" 2>"$err" && { echo "'$a' ran"; exit 1; }
  [ $? -eq 2 ] && grep -q "usage: inference" "$err" || { echo "'$a': not exit 2 with usage"; exit 1; }
done
"$prog" 1 2 2>/dev/null; [ $? -eq 2 ] || { echo "two arguments accepted"; exit 1; }
"$prog" --help | grep -q "usage: inference" || { echo "--help"; exit 1; }
SIMCUDA_DEVICE_MEM=32M "$prog" 1 2>"$err"; rc=$?
[ $rc -eq 2 ] && grep -q "cannot load the model: out of memory" "$err" || { echo "CUDA failure: $rc"; cat "$err"; exit 1; }
echo "inference_usage: every bad argument refused, --help and a CUDA failure reported"
