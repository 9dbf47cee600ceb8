#!/bin/sh
# Compares the ABI of the built shared libraries with the committed baselines
# (abi/*.abi, libabigail's abidw) and fails on any change that could break a
# program built against the baseline's headers.
#   usage: scripts/abi-check.sh BUILD            check
#          scripts/abi-check.sh BUILD --update   report, then rewrite the baselines
#
# What passes (docs/DESIGN.md, "ABI"):
#   - no change;
#   - added functions (and enumerators appended to an enum, which abidiff
#     itself counts as harmless): listed, the baseline records them when it is
#     next regenerated;
#   - fields appended to a sized structure (one whose first member is
#     `size_t size`, found in include/hotkern/*.h), each at or beyond the
#     structure's old size.
# Everything else fails: removed or changed functions, a changed, moved or
# removed field, a field inserted before the old end, growth of any other
# type (hk_dim3, hk_header), a new soname. abidiff (libabigail 2.2) gives no
# exit status that tells appended fields from other growth, and its
# has_data_member_inserted_at suppressions also hide changed fields of a type
# that grew, so its leaf report is read instead, and any line this script does
# not recognise fails the check.
set -u
BUILD=${1:-build}
MODE=${2:-check}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
LIBS="libhotkern libhotkern-net"
MAJOR=$(awk '/define HK_VERSION_MAJOR/ {print $3}' include/hotkern/hotkern.h)
# The baselines keep source locations: without them, abidiff's
# --drop-private-types took every type of the baseline for a private one and
# reported a changed public structure as no change (tried). Locations that
# moved with an edit are no ABI change and need no new baseline.
DW_OPTS="--headers-dir include/hotkern --drop-private-types --exported-interfaces-only --no-corpus-path
  --type-id-style hash"
DIFF_OPTS="--headers-dir2 include/hotkern --drop-private-types --fail-no-debug-info"

for t in abidw abidiff; do
  command -v $t >/dev/null 2>&1 || { echo "abi: $t missing (make deps installs abigail-tools)" >&2; exit 1; }
done

# Names of the sized structures: `typedef struct NAME {` whose next line
# declares `size_t size;`.
sized=$(awk '/^typedef struct [a-z_0-9]+ \{/ { name = $3; next }
             name != "" && /^ *size_t size;/ { print name }
             { name = "" }' include/hotkern/*.h | tr '\n' ' ')

# Reads an abidiff --leaf-changes-only report on stdin; exits 0 when every
# change in it is a field appended to a sized structure.
only_appended() {
  awk -v sized=" $sized " -v q="'" '
    function bad(why) { print "abi:   not an append to a sized structure: " why; failed = 1 }
    /^(Leaf changes summary|Changed leaf types summary|Removed\/Changed\/Added)/ { next }
    /^$/ { next }
    $0 ~ ("^" q "struct [a-z_0-9]+" q " changed:$") {
      name = $2; gsub(q, "", name); old = -1
      if (index(sized, " " name " ") == 0) bad("struct " name " is not sized")
      next
    }
    name != "" && /^  type size changed from [0-9]+ to [0-9]+ \(in bits\)$/ {
      old = $5 + 0
      if ($7 + 0 <= old) bad(name " did not grow")
      next
    }
    name != "" && /^  [0-9]+ data member insertions?:$/ { next }
    name != "" && old >= 0 && $0 ~ ("^    " q ".*" q ", at offset [0-9]+ \\(in bits\\)$") {
      off = $(NF - 2) + 0
      if (off < old) bad(name ": a field inserted at bit " off ", before the old end (" old ")")
      next
    }
    { bad($0) }
    END { exit failed }'
}

status=0
for lib in $LIBS; do
  so="$BUILD/lib/$lib.so.$MAJOR"
  base="abi/$lib.abi"
  [ -f "$so" ] || { echo "abi: $so not built" >&2; exit 1; }
  if [ ! -f "$base" ]; then
    [ "$MODE" = --update ] || { echo "abi: no baseline $base: make abi-baseline" >&2; status=1; continue; }
  else
    report=$(mktemp)
    # shellcheck disable=SC2086
    abidiff --no-added-syms --leaf-changes-only --no-show-locs $DIFF_OPTS "$base" "$so" >"$report" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
      echo "abi: $lib: same ABI as $base"
    elif [ $((rc & 3)) -ne 0 ] || [ $((rc & 8)) -ne 0 ]; then
      cat "$report"
      echo "abi: $lib: abidiff exit $rc (error or incompatible change)"
      status=1
    elif only_appended <"$report"; then
      echo "abi: $lib: fields appended to sized structures (compatible):"
      sed -n "s/^'struct \(.*\)' changed:\$/abi:   \1/p" "$report"
    else
      cat "$report"
      echo "abi: $lib: incompatible with $base"
      status=1
    fi
    # Added functions are compatible: name them.
    # shellcheck disable=SC2086
    abidiff --added-fns --no-show-locs $DIFF_OPTS "$base" "$so" 2>/dev/null |
      sed -n "s/^  \[A\] 'function \(.*\)'.*/abi: $lib: added (compatible): \1/p"
    rm -f "$report"
  fi
  if [ "$MODE" = --update ]; then
    # shellcheck disable=SC2086
    abidw $DW_OPTS --out-file "$base" "$so" || exit 1
    # The directory the library was built in says nothing about its ABI.
    sed -i "s| comp-dir-path='[^']*'||" "$base"
    echo "abi: wrote $base"
  fi
done
if [ "$MODE" = --update ]; then
  exit 0
fi
[ $status -eq 0 ] || echo "abi: incompatible ABI change; see docs/DESIGN.md, \"ABI\" (make abi-baseline after a major version bump)"
exit $status
