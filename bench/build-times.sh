#!/bin/sh
# Build and test times of two revisions, side by side on one machine: what a
# fresh clone's `make demo` and `make test` cost a user, before and after.
# usage: sh bench/build-times.sh [OLD [NEW]]
#   OLD  default: the merge base of NEW with main
#   NEW  default: HEAD
# Each revision gets a fresh clone in a temporary folder; the steps run one
# revision after the other (OLD's step, NEW's step, the next step), each from
# a clean tree, with ccache off (CCACHE_DISABLE=1, CC=cc) and none of the
# caller's make flags, so that every object is really compiled. Prints a
# table of wall times and NEW/OLD ratios; the logs stay in the folder it
# names (HK_BT_KEEP=1 keeps the clones too).
#   HK_BT_STEPS         the steps, default "demo test"; also "build" (make build)
#   HK_BT_DEMO_SECONDS  how long the demo runs on a GPU (hotkern-demo --seconds,
#                       default 5); without a GPU it validates its kernels and ends
# A revision whose Makefile has no DEMO_ARGS (before it, `make demo` ran the
# demo for its default 60 s) is timed for what its `make demo` ran, with the
# demo's --seconds: make deps, make build, sh demo/run.sh build --seconds N.
# Run it on a quiet machine: another job's load goes into both columns.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
new=${2:-HEAD}
old=${1:-$(git -C "$root" merge-base main "$new")}
steps=${HK_BT_STEPS:-demo test}
secs=${HK_BT_DEMO_SECONDS:-5}
old_id=$(git -C "$root" rev-parse --short "$old^{commit}")
new_id=$(git -C "$root" rev-parse --short "$new^{commit}")
dir=$(mktemp -d /tmp/hotkern-build-times-XXXXXX)
mkdir "$dir/logs"

# A make as a user types it, here: no flags of a make above, plain cc.
mk() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL CCACHE_DISABLE=1 CC=cc CXX=g++ make "$@"; }

for side in old new; do
  eval "rev=\$$side"
  git clone -q --no-checkout "$root" "$dir/$side"
  git -C "$dir/$side" checkout -q --detach "$(git -C "$root" rev-parse "$rev^{commit}")"
done

# step SIDE STEP: runs STEP in SIDE's clone from a clean tree; prints its wall
# time in seconds and its exit status.
step() {
  c=$dir/$1
  log=$dir/logs/$(echo "$2" | tr '/' '_')-$1.log
  (cd "$c" && mk clean >/dev/null 2>&1 || true)
  t0=$(date +%s.%N)
  set +e
  case $2 in
    demo)
      if grep -q 'DEMO_ARGS' "$c/Makefile"; then
        (cd "$c" && mk demo DEMO_ARGS="--seconds $secs") >"$log" 2>&1
      else
        (cd "$c" && mk deps && mk build && sh demo/run.sh build --seconds "$secs") >"$log" 2>&1
      fi ;;
    *) (cd "$c" && mk "$2") >"$log" 2>&1 ;;
  esac
  rc=$?
  set -e
  t1=$(date +%s.%N)
  echo "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') $rc"
}

i=0
for s in $steps; do
  i=$((i + 1))
  for side in old new; do
    echo "build-times: make $s at $side ($(eval "echo \$${side}_id"))..." >&2
    step "$side" "$s" >"$dir/result-$i-$side"
  done
done

echo "build and test times, $(nproc) cores, ccache off, $(date -u '+%Y-%m-%d %H:%M UTC')"
printf '%-12s %16s %16s %8s\n' "" "old $old_id" "new $new_id" "new/old"
cell() { if [ "$2" -eq 0 ]; then printf '%.1f s' "$1"; else printf '%.1f s (exit %s)' "$1" "$2"; fi; }
i=0
for s in $steps; do
  i=$((i + 1))
  read -r ot orc <"$dir/result-$i-old"
  read -r nt nrc <"$dir/result-$i-new"
  ratio=$(awk -v a="$ot" -v b="$nt" 'BEGIN { if (a > 0) printf "%.2f", b / a; else print "-" }')
  printf '%-12s %16s %16s %8s\n' "make $s" "$(cell "$ot" "$orc")" "$(cell "$nt" "$nrc")" "$ratio"
done
echo "logs: $dir/logs"
if [ "${HK_BT_KEEP:-0}" = 1 ]; then
  echo "clones: $dir/old $dir/new"
else
  rm -rf "$dir/old" "$dir/new"
fi
