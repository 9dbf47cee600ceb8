#!/bin/sh
# The tour of an existing program (demo/nvcc/particles.cu, nothing of hotkern
# in it), once per way in: the -cudart shared build under LD_PRELOAD and the
# static build linked with --wrap. While each runs, a copy of its source is
# edited as a developer would: a change of the kernel's code (the particles
# drift), a broken save (refused, the program keeps running), a change of the
# kernel's parameters (refused: the program's call sites pass the old ones; a
# C++ kernel's name holds its parameter types, so its old name is missing),
# and the edit saved again. Everything goes to BUILD/demo-out/nvcc.
# usage: sh demo/nvcc/tour.sh BUILD      (`make demo-nvcc`)
set -u
build=${1:?usage: sh demo/nvcc/tour.sh BUILD}
here=$(dirname "$0")
out=$build/demo-out/nvcc
rm -rf "$out" && mkdir -p "$out/kernels" "$out/cache"
src=$out/kernels/particles.cu

# wait_for LOG PATTERN: up to 30 s.
wait_for() {
  i=0
  while [ $i -lt 300 ]; do
    grep -Eqs "$2" "$1" && return 0
    sleep 0.1
    i=$((i + 1))
  done
  echo "tour: gave up waiting for '$2' in $1"
  return 1
}

# save SED-EXPRESSION: the source with one edit, saved with one rename.
save() {
  sed "$1" "$here/particles.cu" >"$src.tmp" && mv "$src.tmp" "$src"
}

status=0
for way in shared static; do
  log=$out/$way.log
  cp "$here/particles.cu" "$src"
  set -- HOTKERN_WATCH="$out/kernels" HOTKERN_CACHE_DIR="$out/cache" HOTKERN_LOG=info
  [ "$way" = shared ] && set -- "$@" LD_PRELOAD="$build/lib/libhotkern-preload.so"
  echo "== particles-$way: $*"
  env "$@" "$build/bin/particles-$way" 16 >"$log" 2>&1 &
  pid=$!
  wait_for "$log" '^(SKIP|tick)' || { kill $pid; status=1; continue; }
  if grep -q '^SKIP' "$log"; then
    wait $pid
    echo "no GPU here: the program ran its own code only; the hot source checks:"
    "$build/bin/hotkern" check --arch sm_90 "$src" || status=1
    break
  fi
  sleep 2
  echo "-- edit: wind = 3.0f (the particles drift right)"
  save 's/const float wind = 0.0f;/const float wind = 3.0f;/'
  wait_for "$log" 'committed particles v1' || status=1
  sleep 2
  echo "-- broken save (a typo)"
  save 's/const float wind = 0.0f;/const float wind = 3.0f/'
  wait_for "$log" 'refused particles' || status=1
  sleep 2
  echo "-- a new parameter for step() (its C++ name changes with its parameters)"
  save 's/float dt) {/float dt, float drag) {/'
  wait_for "$log" "refused particles.*(parameter|missing)" || status=1
  sleep 2
  echo "-- the first edit again, with more wind"
  save 's/const float wind = 0.0f;/const float wind = 6.0f;/'
  wait_for "$log" 'committed particles v2' || status=1
  wait $pid || status=1
  grep -E '^(tick|host|done)|committed|refused' "$log" | sed 's/^/  /'
done
exit $status
