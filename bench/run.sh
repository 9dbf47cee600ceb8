#!/bin/sh
# Runs every benchmark in the order bench/RESULTS.md reports them.
# usage: bench/run.sh BUILD      (prebuilt binaries; never recompiles)
B=${1:-build}
set -u
for b in bench_build bench_launch bench_swap bench_save bench_canary bench_canary_cost; do
  "$B/bench/$b" || echo "bench: $b exited $?"
done
# The launch path's fence, the other way (see loader/gate.h, hkl_enter).
HK_NO_MEMBARRIER=1 "$B/bench/bench_launch" | grep '^launch'
python3 bench/cupy_peer.py "$B/bench/bench_swap" || echo "bench: cupy_peer failed"
for load in idle busy; do
  for mode in none hk hk-module hk-safe hk-auto naive probe-ctxsync probe-unload probe-state; do
    "$B/bench/bench_stall" "$mode" "$load" | grep -v '^==\|^machine' || true
  done
done
# Under load (section 7) and the soak (section 9): long; run on their own.
HK_LOAD_PHASES=hk HK_LOAD_CAP_S=15 "$B/bench/bench_load" 8 32 || echo "bench: bench_load exited $?"
"$B/bench/bench_soak" 600 || echo "bench: bench_soak exited $?"
