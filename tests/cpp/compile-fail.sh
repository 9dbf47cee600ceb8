#!/bin/sh
# hotkern.hpp's compile-time argument rule: tests/cpp/typecheck.cc must
# compile as it stands (with exceptions and without, warning-free under strict
# flags), and each HK_CASE_* below must make it fail to compile with the
# message given (a static_assert's text, or for the stream case the
# compiler's complaint about hk::stream); every static assertion a case
# trips must be its own, so a case cannot pass on another error. Prints a
# PASS or FAIL line per check and one summary line; exits 1 on a failure.
# With clang++ on PATH the same checks run with it too.
#   usage: tests/cpp/compile-fail.sh      (CXX, default g++; CUDA, default /usr/local/cuda)
CXX=${CXX:-g++}
CUDA=${CUDA:-/usr/local/cuda}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SRC=$ROOT/tests/cpp/typecheck.cc
STRICT="-std=c++17 -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wsign-conversion \
-Wold-style-cast -Wnon-virtual-dtor -Wundef -Werror"
tmp=$(mktemp -d /tmp/hotkern-compile-XXXXXX)
trap 'rm -rf "$tmp"' EXIT INT TERM
passed=0 failed=0

pass() { echo "PASS compile $1"; passed=$((passed + 1)); }
fail() { echo "FAIL compile $1: $2"; failed=$((failed + 1)); }

# compile CXX OUT FLAGS...: compiles typecheck.cc (object discarded).
compile() {
  cxx=$1 out=$2
  shift 2
  # shellcheck disable=SC2086
  $cxx $STRICT -I"$ROOT/include" -I"$ROOT" -I"$CUDA/include" "$@" -c "$SRC" -o "$tmp/o.o" \
    >"$out" 2>&1
}

# The cases: NAME|message the error must carry.
cases='POINTEE|hk::kernel: a pointer argument points to another type than the kernel'"'"'s parameter
FEWER|hk::kernel: the launch passes another number of arguments than the kernel'"'"'s signature declares
MORE|hk::kernel: the launch passes another number of arguments than the kernel'"'"'s signature declares
SIGN|hk::kernel: an arithmetic parameter takes a number that converts to it without narrowing or a change of sign
LITERAL|hk::kernel: an arithmetic parameter takes a number that converts to it without narrowing or a change of sign
NARROW_FLOAT|hk::kernel: an arithmetic parameter takes a number that converts to it without narrowing or a change of sign
INT_FOR_POINTER|hk::kernel: a pointer parameter takes a pointer or nullptr, not an integer or an object
DROPS_CONST|hk::kernel: a pointer-to-const argument for a pointer-to-non-const parameter
STRUCT|hk::kernel: a struct, enum or other non-arithmetic parameter takes an argument of exactly its type
ENUM|hk::kernel: a struct, enum or other non-arithmetic parameter takes an argument of exactly its type
CONFIG_FORM|hk::kernel: a pointer argument points to another type than the kernel'"'"'s parameter
LAUNCH_EX_FORM|hk::kernel: an arithmetic parameter takes a number that converts to it without narrowing or a change of sign
PINNED_FORM|hk::kernel: a pointer argument points to another type than the kernel'"'"'s parameter
NO_STREAM|hk::stream
REFERENCE|hk::kernel: a kernel parameter cannot be a reference
NOT_TRIVIAL|hk::kernel: every kernel parameter must be trivially copyable
SIGNATURE|hk::kernel<Sig>: Sig is a kernel'"'"'s signature, void(parameter types...)'

run_with() {
  cxx=$1
  tag=$(basename "$cxx")
  if compile "$cxx" "$tmp/ok.log"; then
    pass "$tag: typecheck.cc compiles"
  else
    fail "$tag: typecheck.cc" "does not compile:"
    sed 's/^/    /' "$tmp/ok.log" | head -40
    return # the cases below would prove nothing
  fi
  if compile "$cxx" "$tmp/noexc.log" -fno-exceptions; then
    pass "$tag: typecheck.cc compiles with -fno-exceptions"
  else
    fail "$tag: typecheck.cc with -fno-exceptions" "does not compile:"
    sed 's/^/    /' "$tmp/noexc.log" | head -40
  fi
  echo "$cases" | while IFS='|' read -r name msg; do
    log=$tmp/$name.log
    if compile "$cxx" "$log" -DHK_CASE_"$name"; then
      echo "FAIL compile $tag: $name compiled"
    elif ! grep -qF -- "$msg" "$log"; then
      echo "FAIL compile $tag: $name failed without \"$msg\":"
      sed 's/^/    /' "$log" | head -30
    elif grep -E 'static.?assert' "$log" | grep -E 'error' | grep -vqF -- "$msg"; then
      echo "FAIL compile $tag: $name tripped another static assertion:"
      grep -E 'static.?assert' "$log" | sed 's/^/    /'
    else
      echo "PASS compile $tag: $name rejected: $msg"
    fi
  done >"$tmp/cases.out"
  cat "$tmp/cases.out"
  passed=$((passed + $(grep -c '^PASS' "$tmp/cases.out")))
  failed=$((failed + $(grep -c '^FAIL compile' "$tmp/cases.out")))
}

run_with "$CXX"
if command -v clang++ >/dev/null 2>&1 && [ "$(basename "$CXX")" != clang++ ]; then
  run_with clang++
else
  echo "compile: clang++ not on PATH, checked with $CXX only"
fi
echo "compile checks: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
