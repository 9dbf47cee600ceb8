#!/bin/sh
# `hotkern check` of 10 small CUDA C files that include one common header,
# with one checker for all of them (the default: NVRTC's precompiled header
# and the include search path shared) and with --no-reuse (each file checked
# alone), interleaved: every round runs both, in alternating order, so that
# both see the host alike. Two sets of files: the header first, and a
# toolkit header (<cuda_fp16.h>) before it, which the precompiled header
# can cover. Each round writes a constant of its own into the header, so no
# cache of any kind can serve a build. Prints each series' median and
# spread of wall time, and the median of each round's ratio (bench/RESULTS.md,
# section 14).
#   usage: bench/check_reuse.sh [BUILD [ROUNDS]]
B=${1:-build}
ROUNDS=${2:-11}
set -eu
HK=$(cd "$B/bin" && pwd)/hotkern
tmp=$(mktemp -d /tmp/hotkern-check-bench-XXXXXX)
trap 'rm -rf "$tmp"' EXIT INT TERM

# files DIR PRELUDE: the 10 sources of one set.
files() {
  mkdir -p "$1"
  for i in 0 1 2 3 4 5 6 7 8 9; do
    printf '%s#include "common.cuh"\n' "$2" >"$1/k$i.cu"
    cat >>"$1/k$i.cu" <<EOF
extern "C" __global__ void k$i(float *x, const float *y, int n) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n) x[t] = scale(y[t], $i) + BIAS;
}
EOF
  done
}
files "$tmp/plain" ""
files "$tmp/fp16" "#include <cuda_fp16.h>
"

# ms SET MODE: one run's wall time in milliseconds.
ms() {
  t0=$(date +%s%N)
  (cd "$tmp/$1" && "$HK" check $2 k0.cu k1.cu k2.cu k3.cu k4.cu k5.cu k6.cu k7.cu k8.cu k9.cu \
    >/dev/null)
  t1=$(date +%s%N)
  echo $(((t1 - t0) / 1000000))
}

# Every file must check: a failing build would time something else.
for set in plain fp16; do
  printf '#pragma once\n#define BIAS 1.0f\n__device__ inline float scale(float v, int i) { return v; }\n' \
    >"$tmp/$set/common.cuh"
  (cd "$tmp/$set" && "$HK" check k0.cu k1.cu k2.cu k3.cu k4.cu k5.cu k6.cu k7.cu k8.cu k9.cu \
    >/dev/null) || { echo "check_reuse: the $set files do not check" >&2; exit 1; }
done

r=1
while [ $r -le "$ROUNDS" ]; do
  for set in plain fp16; do
    printf '#pragma once\n#define BIAS %d.0f\n__device__ inline float scale(float v, int i) { return v * (i + 2); }\n' \
      "$(($$ * 100 + r))" >"$tmp/$set/common.cuh"
    if [ $((r % 2)) -eq 1 ]; then
      a=$(ms $set "") b=$(ms $set --no-reuse)
    else
      b=$(ms $set --no-reuse) a=$(ms $set "")
    fi
    echo "$set reuse $a" >>"$tmp/times"
    echo "$set no-reuse $b" >>"$tmp/times"
    echo "$set ratio $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }')" >>"$tmp/times"
  done
  r=$((r + 1))
done

echo "machine: $(nproc) CPUs, $(uname -m), $(date -u '+%Y-%m-%d %H:%M UTC'), $ROUNDS rounds"
for set in plain fp16; do
  for mode in reuse no-reuse; do
    grep "^$set $mode " "$tmp/times" | awk '{print $3}' | sort -n | awk -v s="$set" -v m="$mode" '
      { v[NR] = $1 }
      END { printf "%-5s %-8s median %5d ms  min %5d  max %5d\n", s, m, v[int((NR + 1) / 2)], v[1], v[NR] }'
  done
  grep "^$set ratio " "$tmp/times" | awk '{print $3}' | sort -n | awk -v s="$set" '
    { v[NR] = $1 }
    END { printf "%-5s reuse / no-reuse, same round: median x%.3f  min x%.3f  max x%.3f\n", s,
          v[int((NR + 1) / 2)], v[1], v[NR] }'
done
