#!/bin/sh
# Runs the example programs built under BUILD/examples and checks what they
# print; prints one summary line. usage: tests/run-examples.sh BUILD
#
# First, on any machine: the examples that need only libhotkern load none of
# libhotkern-net, libcurl, libmicrohttpd or cJSON. Then each example runs
# under a timeout. Without a CUDA device each prints "SKIP: <reason>" and
# exits 0, which counts as skipped. On a device:
#   swap_and_launch  must end with x[0] = 20 (v1 added 1, v2 multiplied by 10);
#   typed_launch     the same through hotkern.hpp (x[0] = 2, then 20), plus a
#                    handle of another signature refused at bind, a version
#                    with another parameter refused by its swap (accept_layout_change
#                    set), and v2 still running after it (x[0] = 200);
#   watch_dir        is given a directory; a saved version, an edit and a
#                    broken save must show as x[0] = 1, x[0] = 2 and "refused";
#   receive_pushes   gets `hotkern push`es on loopback: a release, a broken
#                    one (refused, exit 1, the compile error in --json) and an
#                    edit; x[0] must follow, and the refusal be printed.
# HK_EXAMPLE_TIMEOUT (default 60) bounds each example, in seconds.
BUILD=${1:-build}
EX=$BUILD/examples
HOTKERN=$BUILD/bin/hotkern
LIMIT=${HK_EXAMPLE_TIMEOUT:-60}
tmp=$(mktemp -d /tmp/hotkern-examples-XXXXXX)
trap 'rm -rf "$tmp"' EXIT INT TERM
passed=0 failed=0 skipped=0 bad=""

fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); bad="$bad $1"; }

# wait_for LOG PATTERN: until the log has a line matching PATTERN (grep -E),
# at most 30 s; returns 1 on time-out.
wait_for() {
  i=0
  while [ $i -lt 300 ]; do
    grep -Eqs "$2" "$1" && return 0
    sleep 0.1
    i=$((i + 1))
  done
  return 1
}

# kernel FILE VALUE: a CUDA C module whose fill(x, n) writes VALUE.
kernel() {
  printf 'extern "C" __global__ void fill(float *x, int n) {\n' >"$1.tmp"
  printf '    int i = threadIdx.x;\n    if (i < n) x[i] = %s;\n}\n' "$2" >>"$1.tmp"
  mv "$1.tmp" "$1" # one rename: the watcher sees one complete save
}

# finish NAME PID LOG: stops a background example and checks it stopped well.
# The examples in the background run under `timeout --foreground`: without
# it, timeout passes a SIGTERM on to the example twice (to it and to its
# process group), and once killed an example on the way out (exit 143 after
# printing "stopped", on the H200).
finish() {
  kill -TERM "$2" 2>/dev/null
  wait "$2"
  rc=$?
  if [ $rc -ne 0 ]; then
    fail "$1" "exit $rc after SIGTERM"
  elif grep -q '^stopped' "$3"; then
    passed=$((passed + 1))
  else
    fail "$1" "did not stop cleanly"
  fi
}

# show NAME LOG: what an example printed.
show() {
  echo "== $1"
  sed 's/^/  /' "$2"
}

# skipped NAME LOG: 0 when the example said SKIP (counted).
skipped() {
  if grep -q '^SKIP: ' "$2"; then
    grep '^SKIP: ' "$2" | sed "s/^/$1: /"
    skipped=$((skipped + 1))
    return 0
  fi
  return 1
}

for e in swap_and_launch typed_launch watch_dir receive_pushes; do
  [ -x "$EX/$e" ] || fail "$e" "not built ($EX/$e)"
done
for e in swap_and_launch typed_launch watch_dir; do
  [ -x "$EX/$e" ] || continue
  if ldd "$EX/$e" | grep -Eq 'libhotkern-net|libcurl|libmicrohttpd|libcjson'; then
    fail "$e" "loads more than libhotkern: $(ldd "$EX/$e" | grep -E 'hotkern|curl|httpd|cjson')"
  else
    passed=$((passed + 1))
  fi
done

# (a) swap and launch
log=$tmp/swap.log
timeout "$LIMIT" "$EX/swap_and_launch" >"$log" 2>&1
rc=$?
if ! skipped swap_and_launch "$log"; then
  show swap_and_launch "$log"
  if [ $rc -eq 0 ] && grep -q '^after v1: x\[0\] = 2$' "$log" && grep -q '^after v2: x\[0\] = 20 ' "$log"; then
    passed=$((passed + 1))
  else
    fail swap_and_launch "exit $rc, or x[0] not 2 then 20"
  fi
fi

# (a') typed launches from C++
log=$tmp/typed.log
timeout "$LIMIT" "$EX/typed_launch" >"$log" 2>&1
rc=$?
if ! skipped typed_launch "$log"; then
  show typed_launch "$log"
  if [ $rc -ne 0 ]; then
    fail typed_launch "exit $rc"
  elif ! grep -q '^after v1: x\[0\] = 2$' "$log" || ! grep -q '^after v2: x\[0\] = 20$' "$log"; then
    fail typed_launch "x[0] not 2 then 20"
  elif ! grep -q "^refused signature void(float \*, long long): binding kernel 'step' of module 'demo': .*parameter 1" "$log"; then
    fail typed_launch "the other signature was not refused at bind, naming the parameter"
  elif ! grep -q '^refused: .*no version may change' "$log"; then
    fail typed_launch "the version with another parameter was not refused"
  elif ! grep -q '^after the refusal: x\[0\] = 200 ' "$log"; then
    fail typed_launch "v2 did not run on after the refusal"
  else
    passed=$((passed + 1))
  fi
fi

# (b) watch a directory
log=$tmp/watch.log
: >"$log" # before the background start, for wait_for
mkdir "$tmp/k"
kernel "$tmp/k/scale.cu" 1.0f
timeout --foreground "$LIMIT" "$EX/watch_dir" "$tmp/k" scale fill "$LIMIT" >"$log" 2>&1 &
pid=$!
wait_for "$log" '^(SKIP: |watching )'
if skipped watch_dir "$log"; then
  wait "$pid"
elif ! wait_for "$log" '^x\[0\] = 1 '; then
  fail watch_dir "the first version did not run"
  kill "$pid"
else
  kernel "$tmp/k/scale.cu" 2.0f
  wait_for "$log" '^x\[0\] = 2 ' || fail watch_dir "the edit did not run"
  kernel "$tmp/k/scale.cu" 'undefined_name'
  wait_for "$log" '^refused scale' || fail watch_dir "the broken save was not refused"
  finish watch_dir "$pid" "$log"
fi
grep -q '^SKIP: ' "$log" || show watch_dir "$log"

# (c) receive signed pushes
log=$tmp/push.log
: >"$log"
kernel "$tmp/v1.cu" 1.0f
kernel "$tmp/v2.cu" 2.0f
kernel "$tmp/broken.cu" 'undefined_name'
"$HOTKERN" keygen --out "$tmp/keys" >/dev/null || fail receive_pushes "hotkern keygen failed"
XDG_STATE_HOME=$tmp/state timeout --foreground "$LIMIT" "$EX/receive_pushes" "$tmp/keys/hotkern.pub" \
  scale fill "$LIMIT" >"$log" 2>&1 &
pid=$!
wait_for "$log" '^(SKIP: |listening on )'
url=$(sed -n 's/^listening on //p' "$log")
push() { "$HOTKERN" push "$url" --key "$tmp/keys/hotkern.key" --module scale --json "$@"; }
if skipped receive_pushes "$log"; then
  wait "$pid"
elif [ -z "$url" ]; then
  fail receive_pushes "no endpoint"
  kill "$pid"
else
  out=$(push "$tmp/v1.cu") || fail receive_pushes "push of v1: $out"
  wait_for "$log" '^x\[0\] = 1$' || fail receive_pushes "the pushed release did not run"
  out=$(push "$tmp/broken.cu")
  rc=$?
  case "$out" in
    *'"error":"HK_ERR_COMPILE"'*) [ $rc -eq 1 ] || fail receive_pushes "broken push: exit $rc" ;;
    *) fail receive_pushes "broken push: $out" ;;
  esac
  wait_for "$log" '^refused scale' || fail receive_pushes "the refusal was not printed"
  out=$(push "$tmp/v2.cu") || fail receive_pushes "push of v2: $out"
  wait_for "$log" '^x\[0\] = 2$' || fail receive_pushes "the second release did not run"
  finish receive_pushes "$pid" "$log"
fi
grep -q '^SKIP: ' "$log" || show receive_pushes "$log"

# (d) an existing program, unchanged, both ways in: it watches a copy of its
# own source; an edit of fill() changes x[0], a broken save is refused.
for way in shared static; do
  e=existing_program_$way
  [ -x "$EX/$e" ] || { fail "$e" "not built"; continue; }
  log=$tmp/$e.log
  : >"$log"
  rm -rf "$tmp/ep" && mkdir "$tmp/ep"
  cp examples/existing_program.cu "$tmp/ep/"
  pre=
  [ "$way" = shared ] && pre=$BUILD/lib/libhotkern-preload.so
  LD_PRELOAD=$pre HOTKERN_WATCH=$tmp/ep HOTKERN_CACHE_DIR=$tmp/ep-cache HOTKERN_LOG=warn \
    timeout --foreground "$LIMIT" "$EX/$e" "$LIMIT" >"$log" 2>&1 &
  pid=$!
  wait_for "$log" '^(SKIP: |running)'
  if skipped "$e" "$log"; then
    wait "$pid"
    continue
  fi
  if ! wait_for "$log" '^x\[0\] = 2$'; then
    fail "$e" "the program's own code did not run"
    kill "$pid"
  else
    sed 's/x\[i\] = gain;/x[i] = gain * 10.0f;/' examples/existing_program.cu >"$tmp/ep/e.tmp" &&
      mv "$tmp/ep/e.tmp" "$tmp/ep/existing_program.cu"
    wait_for "$log" '^x\[0\] = 20$' || fail "$e" "the edit did not run"
    sed 's/x\[i\] = gain;/x[i] = gain * 10.0f/' examples/existing_program.cu >"$tmp/ep/e.tmp" &&
      mv "$tmp/ep/e.tmp" "$tmp/ep/existing_program.cu"
    wait_for "$log" 'refused existing_program' || fail "$e" "the broken save was not refused"
    finish "$e" "$pid" "$log"
  fi
  show "$e" "$log"
done

[ -n "$bad" ] && echo "FAILED examples:$bad"
echo "examples: $passed passed, $failed failed, $skipped skipped"
[ -z "$bad" ]
