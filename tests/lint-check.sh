#!/bin/sh
# Shows that `make lint`'s checks of the sources refuse what they are there to
# refuse, and only that: each case copies what the checks read (the library's
# folders, include/, pkg/'s symbol maps and scripts/ itself) into a scratch
# folder, puts ONE violation into the copy, runs the check on it and wants it
# to fail with the line that names the file or function; the untouched copy,
# and copies brought exactly to a limit, must pass. Prints one summary line.
# usage: sh tests/lint-check.sh [BUILD]
#
# The checks find their sources from where they lie (scripts/..), so the copy
# of scripts/ checks the copy. scripts/layers.py also reads the symbols of the
# library's objects (nm) under BUILD/obj, which it is given as an absolute
# path: the objects are those of the real sources, and the violations are
# made with includes and lines, which need no compiler.
#   untouched      api.sh and layers.py pass on the copy as it is
#   lint-target    the Makefile's lint target runs both checks
#   at-limits      1,000 lines in net/json.c, 800 in loader/gate.c and a
#                  canary/ function of 100 lines pass
#   file-over      net/json.c at 1,001 lines fails, named
#   loader-over    loader/gate.c at 801 lines fails, named
#   circle         net/endpoint.h and net/puller.h including each other
#   arrow-up       util/util.c including net/net.h
#   past-port      watch/files.c including loader/core.h (not loader/port.h)
#   long-function  a canary/ function of 101 lines
#   unplaced       a loader/ .c file the order does not place
#   since-control  a new public function in hotkern.h, with its Since, passes
#   no-since       the same function without a "Since" line fails, named
#   since-node     hk_swap's Since changed to a release other than its node's
#   since-later    hk_swap's Since after the headers' version
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d /tmp/hotkern-lint-check-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
passed=0 failed=0 bad=""

ok() { echo "ok   $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); bad="$bad $1"; }
finish() {
  [ -n "$bad" ] && echo "FAILED lint-check:$bad"
  echo "lint-check: $passed passed, $failed failed"
  [ -z "$bad" ]
  exit $?
}

if ! OBJ=$(cd "$BUILD" 2>/dev/null && pwd) || [ ! -d "$OBJ/obj" ]; then
  fail setup "no objects under $BUILD/obj (make build first)"
  finish
fi
# The folders layers.py reads, from its own list, and what api.sh reads.
folders=$(cd "$ROOT/scripts" && python3 -B -c 'import layers; print(" ".join(layers.FOLDERS))') ||
  { fail setup "scripts/layers.py has no FOLDERS list"; finish; }
(cd "$ROOT" && mkdir "$tmp/pristine" && cp -R $folders pkg scripts "$tmp/pristine/") ||
  { fail setup "cannot copy the sources into $tmp"; finish; }
C=$tmp/copy

# fresh: a new copy of the untouched sources at $C.
fresh() { rm -rf "$C" && cp -R "$tmp/pristine" "$C"; }
# The checks, on the copy: their exit status, their output in $tmp/out.
layers() { python3 "$C/scripts/layers.py" "$OBJ" --check >"$tmp/out" 2>&1; }
api() { sh "$C/scripts/api.sh" --check >"$tmp/out" 2>&1; }

# passes CASE CHECK [TEXT]: CHECK must pass on the copy (and print TEXT).
passes() {
  if ! $2; then
    fail "$1" "$2 failed on it: $(grep -Ev '^( |==)' "$tmp/out" | head -n 3 | tr '\n' ' ')"
  elif [ -n "${3-}" ] && ! grep -qF "$3" "$tmp/out"; then
    fail "$1" "$2 passed without saying \"$3\""
  else
    ok "$1"
  fi
}

# fails CASE CHECK TEXT: CHECK must fail on the copy, with a line containing
# TEXT (the file or function named).
fails() {
  if $2; then
    fail "$1" "$2 passed; expected it to fail with: $3"
  elif ! grep -qF "$3" "$tmp/out"; then
    fail "$1" "$2 failed, but without \"$3\": $(grep -Ev '^( |==)' "$tmp/out" | head -n 3 | tr '\n' ' ')"
  else
    ok "$1"
  fi
}

# pad FILE N: filler lines (comments, none blank) until FILE has N lines.
pad() {
  awk -v have="$(wc -l <"$1")" -v want="$2" \
    'BEGIN { for (i = have + 1; i <= want; i++) printf "/* filler line %d */\n", i }' >>"$1"
}
# func FILE NAME N: a function of N lines (first line to closing brace) at the
# end of FILE, laid out as clang-format lays it out; prints its first line's
# number.
func() {
  echo $(($(wc -l <"$1") + 1))
  awk -v name="$2" -v n="$3" 'BEGIN {
    printf "int %s(void) {\n", name
    for (i = 3; i < n; i++) printf "    (void)%d;\n", i
    printf "    return 0;\n}\n" }' >>"$1"
}
# include_after FILE LINE INCLUDE: adds #include "INCLUDE" after the line LINE
# of FILE (the first line, when no line is LINE).
include_after() {
  if grep -qxF "$2" "$1"; then
    awk -v at="$2" -v inc="$3" '{ print } $0 == at && !done { printf "#include \"%s\"\n", inc; done = 1 }' \
      "$1" >"$1.new"
  else
    { printf '#include "%s"\n' "$3"; cat "$1"; } >"$1.new"
  fi
  mv "$1.new" "$1"
}

fresh
passes untouched-api api
passes untouched-layers layers "layers: the layering holds"

# The lint recipe: from "lint:" to the next blank line.
recipe=$(awk '/^lint:/ { on = 1 } on && /^$/ { exit } on' "$ROOT/Makefile")
case $recipe in
  *"scripts/api.sh --check"*"scripts/layers.py \$(BUILD) --check"*) ok lint-target ;;
  *) fail lint-target "the Makefile's lint target does not run scripts/api.sh --check and scripts/layers.py \$(BUILD) --check" ;;
esac

# Sizes: at the limit passes, one line past it fails.
pad "$C/net/json.c" 1000
pad "$C/loader/gate.c" 800
func "$C/canary/proto.c" lint_probe 100 >/dev/null
passes at-limits layers

fresh
pad "$C/net/json.c" 1001
fails file-over layers "layers: file over 1000 lines: net/json.c (1001)"

fresh
pad "$C/loader/gate.c" 801
fails loader-over layers "layers: file over 800 lines: loader/gate.c (801)"

fresh
include_after "$C/net/endpoint.h" '#include "net/net.h"' net/puller.h
include_after "$C/net/puller.h" '#include "net/net.h"' net/endpoint.h
fails circle layers "layers: circle inside net/: net/endpoint.h net/puller.h"

fresh
include_after "$C/util/util.c" '#include "util/util.h"' net/net.h
fails arrow-up layers "layers: arrow up: include util/util.c -> net/net.h"

fresh
include_after "$C/watch/files.c" '#include "watch/watcher.h"' loader/core.h
fails past-port layers "layers: include past loader/port.h (use it, or add what is needed to it): watch/files.c -> loader/core.h"

fresh
line=$(func "$C/canary/proto.c" lint_probe 101)
fails long-function layers "layers: function over 100 lines: canary/proto.c:$line lint_probe (101)"

fresh
echo '/* A file of loader/ that LOADER_ORDER does not place. */' >"$C/loader/unplaced.c"
fails unplaced layers "layers: loader file not in LOADER_ORDER: loader/unplaced.c"

# A new public function, before hotkern.h's include guard closes.
H=$C/include/hotkern/hotkern.h
version=$(awk '/define HK_VERSION_(MAJOR|MINOR)/ { printf "%s%s", sep, $3; sep = "." }' "$H")
declare_probe() {
  awk -v doc="$1" '$0 == "#endif /* HOTKERN_H */" {
      printf "/* Probes the lint check.%s */\nHK_API int hk_lint_probe(void);\n\n", doc }
    { print }' "$H" >"$H.new" && mv "$H.new" "$H"
  grep -q '^HK_API int hk_lint_probe(void);$' "$H"
}
fresh
if declare_probe " Since $version."; then passes since-control api; else fail since-control "no include guard's end to add before"; fi
fresh
if declare_probe ""; then
  fails no-since api "lint: include/hotkern/hotkern.h: hk_lint_probe: no \"Since MAJOR.MINOR\" in its doc comment"
else
  fail no-since "no include guard's end to add before"
fi

# hk_swap's Since line: the last "Since" above its declaration.
since_of_swap() {
  awk '/Since [0-9]+\.[0-9]+/ { at = NR; s = $0; sub(/.*Since /, "", s); sub(/[^0-9.].*/, "", s); sub(/\.$/, "", s) }
    /^HK_API int hk_swap\(/ { print at, s; exit }' "$H"
}
# swap_since VERSION: gives hk_swap's Since line VERSION.
swap_since() {
  set -- "$1" $(since_of_swap)
  sed "$2s/Since $3/Since $1/" "$H" >"$H.new" && mv "$H.new" "$H"
}
fresh
set -- $(since_of_swap)
if [ -z "${2-}" ]; then
  fail since-node "hk_swap has no Since line in the copy's hotkern.h"
  fail since-later "hk_swap has no Since line in the copy's hotkern.h"
else
  node=$2
  other=1.0
  [ "$node" = 1.0 ] && other=1.1
  swap_since "$other"
  fails since-node api "lint: include/hotkern/hotkern.h: hk_swap: Since $other, but pkg/*.map exports it in the node of $node"
  fresh
  later=${version%%.*}.$((${version#*.} + 1))
  swap_since "$later"
  fails since-later api "lint: include/hotkern/hotkern.h: hk_swap: Since $later, after the headers' $version"
fi

finish
