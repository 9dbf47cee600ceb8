#!/bin/sh
# Runs the Check suites built under BUILD/tests and prints one summary line.
# usage: tests/run.sh BUILD [cpu|gpu]
# A suite binary exits 77 to say it was skipped (it prints a SKIP line and the
# reason first); any other non-zero status is a failure.
BUILD=${1:-build}
which=${2:-all}
case $which in
  cpu) pattern="cpu_*" ;;
  gpu) pattern="gpu_*" ;;
  *) pattern="*" ;;
esac
passed=0 failed=0 skipped=0 bad=""
for t in "$BUILD"/tests/$pattern; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  out=$(mktemp)
  timeout "${HK_TEST_TIMEOUT:-600}" "$t" >"$out" 2>&1
  rc=$?
  cat "$out"
  line=$(grep -E '^[0-9]+%: Checks: [0-9]+' "$out" | tail -n 1)
  rm -f "$out"
  if [ $rc -eq 77 ]; then
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
  if [ $rc -ne 0 ]; then
    bad="$bad $name"
    [ -n "$line" ] && [ "$fails" -gt 0 -o "$errs" -gt 0 ] || failed=$((failed + 1))
  fi
done
[ -n "$bad" ] && echo "FAILED suites:$bad"
echo "$passed passed, $failed failed, $skipped skipped"
[ -z "$bad" ]
