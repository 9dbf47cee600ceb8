#!/bin/sh
# Runs the parts of `make test` one after another, each to its end even when
# one before it failed, and prints one verdict for them all as its last line:
#   make test: N passed, M failed, K skipped (passed/failed/skipped: suites
#   P/F/S, compile checks P/F/S, examples P/F/S, programs P/F/S, abi P/F/S,
#   lint checks P/F/S)
# and, when something failed, "; FAILED: " and the parts (and suites) that did.
# usage: sh tests/all.sh BUILD [PART...]
# PART (default: suites compile examples programs abi lint-check):
#   suites    every Check suite (tests/run.sh; cpu or gpu: those alone)
#   compile   hotkern.hpp's misuses must not compile (tests/cpp/compile-fail.sh,
#             with CXX and CUDA from the environment)
#   examples  the example programs (tests/run-examples.sh)
#   programs  the program shapes (tests/programs/run.sh)
#   abi       the shared libraries against abi/*.abi (scripts/abi-check.sh):
#             its report goes to BUILD/abi.log, one line here
#   lint-check  `make lint`'s checks of the sources fail on each violation
#             put into a scratch copy, and pass on it untouched
#             (tests/lint-check.sh)
# ("make test" is HK_TEST_VERDICT, which the Makefile sets; "tests" without.)
# Each part's own last line, "N passed, M failed[, K skipped]", is what is
# counted; a part that ends without one counts as one failure.
BUILD=${1:-build}
[ $# -gt 0 ] && shift
[ $# -gt 0 ] || set -- suites compile examples programs abi lint-check
tmp=$(mktemp -d /tmp/hotkern-all-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

passed=0 failed=0 skipped=0 parts="" bad=""

# count PART LABEL OUT RC: adds the part's summary line (the last of OUT
# that has one) to the totals and to the verdict's parts.
count() {
  line=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$3" | tail -n 1)
  p=$(echo "$line" | sed -nE 's/(^|.*[^0-9])([0-9]+) passed.*/\2/p')
  f=$(echo "$line" | sed -nE 's/.* ([0-9]+) failed.*/\1/p')
  s=$(echo "$line" | sed -nE 's/.* ([0-9]+) skipped.*/\1/p')
  if [ -z "$p" ] || [ -z "$f" ]; then
    p=0 f=1 s=0
    echo "$1: ended (exit $4) without its summary line"
  fi
  s=${s:-0}
  if [ "$4" -ne 0 ] && [ "$f" -eq 0 ]; then
    f=1 # failed without a failed count (a part that stopped early)
  fi
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
  parts="$parts, $2 $p/$f/$s"
  if [ "$4" -ne 0 ]; then
    # What failed: the suites', examples' and lint checks' FAILED line, the
    # programs' FAIL NAME: lines.
    case $1 in
      suites | examples | lint-check) named=$(sed -n 's/^FAILED [a-z-]*: *//p' "$3" | tail -n 1) ;;
      programs) named=$(sed -n 's/^FAIL \([^ :]*\):.*/\1/p' "$3" | tr '\n' ' ' | sed 's/ $//') ;;
      *) named="" ;;
    esac
    bad="$bad, $2${named:+ ($named)}"
  fi
}

# run PART LABEL COMMAND...: runs a part, its output shown as it comes.
run() {
  part=$1 label=$2
  shift 2
  { "$@"; echo $? >"$tmp/$part.rc"; } 2>&1 | tee "$tmp/$part.out"
  count "$part" "$label" "$tmp/$part.out" "$(cat "$tmp/$part.rc")"
}

# The ABI check's report is long (every function added since the baseline):
# it goes to BUILD/abi.log; here, one line, and on a failure the report's
# lines that are not additions.
abi() {
  log=$BUILD/abi.log
  sh scripts/abi-check.sh "$BUILD" >"$log" 2>&1
  rc=$?
  added=$(grep -c ': added (compatible): ' "$log")
  if [ $rc -eq 0 ]; then
    echo "abi: compatible with abi/*.abi, $added functions added since (report: $log)"
    echo "abi: 1 passed, 0 failed"
  else
    grep -v ': added (compatible): ' "$log"
    echo "FAILED abi: exit $rc (report: $log)"
    echo "abi: 0 passed, 1 failed"
  fi
  return $rc
}

for part in "$@"; do
  case $part in
    suites) run suites suites sh tests/run.sh "$BUILD" ;;
    cpu | gpu) run suites "$part suites" sh tests/run.sh "$BUILD" "$part" ;;
    compile) run compile "compile checks" env CXX="${CXX:-g++}" CUDA="${CUDA:-/usr/local/cuda}" \
      sh tests/cpp/compile-fail.sh ;;
    examples) run examples examples sh tests/run-examples.sh "$BUILD" ;;
    programs) run programs programs sh tests/programs/run.sh "$BUILD" ;;
    abi) run abi abi abi ;;
    lint-check) run lint-check "lint checks" sh tests/lint-check.sh "$BUILD" ;;
    *) echo "tests/all.sh: no part '$part' (suites cpu gpu compile examples programs abi lint-check)" >&2; exit 2 ;;
  esac
done

echo "${HK_TEST_VERDICT:-tests}: $passed passed, $failed failed, $skipped skipped (passed/failed/skipped: ${parts#, })${bad:+; FAILED: ${bad#, }}"
[ -z "$bad" ]
