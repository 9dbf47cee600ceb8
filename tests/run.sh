#!/bin/sh
# Runs the Check suites built under BUILD/tests and prints one summary line.
# usage: tests/run.sh BUILD [cpu|gpu]
# A suite binary exits 77 to say it was skipped (it prints a SKIP line and the
# reason first); any other non-zero status is a failure.
#
# The CPU suites run HK_TEST_JOBS at a time (default: a suite per core), each
# on its own (every suite makes its own temporary folders and takes free
# ports), and each suite's output is printed whole when it ends. The GPU
# suites run one at a time (one device, and timings), as do the suites named
# in HK_TEST_ALONE, after the others: by default cpu_load (it steps the clock
# against the wall clock's) and cpu_watch (its floods of saves), whose tests
# measure what a loaded machine slows. HK_TEST_TIMEOUT (600) bounds a suite,
# in seconds.
BUILD=${1:-build}
which=${2:-all}

# sh tests/run.sh --one TMP SUITE: runs one suite into TMP/NAME.out and
# TMP/NAME.rc, then prints its output, holding TMP/lock so that no other
# suite's output comes between its lines.
if [ "$BUILD" = --one ]; then
  tmp=$2 t=$3
  name=$(basename "$t")
  timeout "${HK_TEST_TIMEOUT:-600}" "$t" >"$tmp/$name.out" 2>&1
  echo $? >"$tmp/$name.rc"
  if command -v flock >/dev/null 2>&1; then
    flock "$tmp/lock" cat "$tmp/$name.out"
  else
    cat "$tmp/$name.out"
  fi
  exit 0
fi

case $which in
  cpu) pattern="cpu_*" ;;
  gpu) pattern="gpu_*" ;;
  *) pattern="*" ;;
esac
jobs=${HK_TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}
alone=" ${HK_TEST_ALONE-cpu_load cpu_watch} "
tmp=$(mktemp -d /tmp/hotkern-run-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
: >"$tmp/lock"

together="" serial="" names=""
for t in "$BUILD"/tests/$pattern; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  names="$names $name"
  case $name in
    cpu_*) case $alone in *" $name "*) serial="$serial $t" ;; *) together="$together $t" ;; esac ;;
    *) serial="$serial $t" ;;
  esac
done
if [ -n "$together" ]; then
  # shellcheck disable=SC2086
  printf '%s\n' $together | xargs -n 1 -P "$jobs" sh "$0" --one "$tmp"
fi
for t in $serial; do
  sh "$0" --one "$tmp" "$t"
done

passed=0 failed=0 skipped=0 bad=""
for name in $names; do
  rc=$(cat "$tmp/$name.rc" 2>/dev/null || echo 1)
  line=$(grep -E '^[0-9]+%: Checks: [0-9]+' "$tmp/$name.out" 2>/dev/null | tail -n 1)
  if [ "$rc" -eq 77 ]; then
    skipped=$((skipped + 1))
    continue
  fi
  if [ -n "$line" ]; then
    checks=$(echo "$line" | sed -E 's/.*Checks: ([0-9]+).*/\1/')
    fails=$(echo "$line" | sed -E 's/.*Failures: ([0-9]+).*/\1/')
    errs=$(echo "$line" | sed -E 's/.*Errors: ([0-9]+).*/\1/')
    passed=$((passed + checks - fails - errs))
    failed=$((failed + fails + errs))
  fi
  if [ "$rc" -ne 0 ]; then
    bad="$bad $name"
    [ -n "$line" ] && [ "$fails" -gt 0 -o "$errs" -gt 0 ] || failed=$((failed + 1))
  fi
done
[ -n "$bad" ] && echo "FAILED suites:$bad"
echo "$passed passed, $failed failed, $skipped skipped"
[ -z "$bad" ]
