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

# The version of each symbol (pkg/*.map). abidiff (2.2) matches functions
# by name: it does not see a function's default version move to another
# node, nor a name given up under one version while it stays under another.
# A program linked against the baseline asks for NAME@VERSION, so every
# NAME@VERSION the baseline defines must still be defined, as the default
# or not; a default that became a non-default one (a function given its
# release's node, the old name kept) is compatible and listed.
#   versions BASELINE LIBRARY LIB
syms_of_baseline() {
  sed -n "s/.*<elf-symbol name='\([^']*\)' version='\([^']*\)' is-default-version='\([a-z]*\)'.*is-defined='yes'.*/\1 \2 \3/p" "$1" |
    awk '{ print $1 ($3 == "yes" ? "@@" : "@") $2 }' | sort
}
syms_of_library() {
  readelf --dyn-syms -W "$1" | awk '$7 != "UND" && $7 != "ABS" && $8 ~ /@/ { print $8 }' | sort
}
versions() {
  syms_of_baseline "$1" >"$report.base"
  syms_of_library "$2" >"$report.lib"
  awk -v lib="$3" '
    NR == FNR { have[$1] = 1; next }
    {
      name = $1; sub(/@.*/, "", name); v = $1; sub(/^[^@]*@@?/, "", v)
      if ((name "@@" v) in have) next
      if ((name "@" v) in have) {
        if ($1 ~ /@@/) printf "abi: %s: %s: default version no longer %s (kept as %s@%s)\n", lib, name, v, name, v
        next
      }
      printf "abi: %s: %s removed: a program linked against the baseline asks for it\n", lib, $1
      bad = 1
    }
    END { exit bad }' "$report.lib" "$report.base"
  v_rc=$?
  rm -f "$report.base" "$report.lib"
  return $v_rc
}
# What each version node holds: its functions, and the other nodes' kept
# names (NAME@NODE, not the default).
#   nodes LIBRARY LIB
nodes() {
  syms_of_library "$1" | awk -v lib="$2" '
    { v = $1; sub(/^[^@]*@@?/, "", v); if ($1 ~ /@@/) def[v]++; else alias[v]++; seen[v] = 1 }
    END {
      n = 0; for (v in seen) order[++n] = v
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (order[j] < order[i]) { t = order[i]; order[i] = order[j]; order[j] = t }
      line = ""
      for (i = 1; i <= n; i++) {
        v = order[i]
        line = line (line == "" ? "" : ", ") v ": " (def[v] + 0) (alias[v] ? " (+" alias[v] " kept names)" : "")
      }
      print "abi: " lib ": version nodes: " line
    }'
}

# A program linked against a release before the version nodes asks for
# each function under the map's @compat node (HOTKERN_1). One is made here:
# a stand-in library of that release's shape (every function of the
# @compat nodes, under that node alone) links a program that calls them all;
# the program must then start against the built library with every symbol
# bound at load (LD_BIND_NOW), as the dynamic linker would bind it. (Its
# variables start with op_: a shell function shares the script's.)
#   old_programs MAP SONAME LIB
old_programs() {
  op_dir=$(mktemp -d)
  awk '/^[ \t*]*@compat[ \t]+[A-Z_0-9]+:/ { line = $0; sub(/.*@compat[ \t]*/, "", line); sub(/:/, "", line)
                   n = split(line, w, " "); base = w[1]; for (i = 2; i <= n; i++) old[w[i]] = 1
                   print base > "/dev/stderr"; next }
       /^[A-Za-z_][A-Za-z0-9_.]* *\{/ { node = $1; next }
       /^\}/ { node = "" }
       node in old && /^ *hk_[a-z0-9_]* *;/ { name = $1; sub(/;/, "", name); print name }' \
    "$1" >"$op_dir/names" 2>"$op_dir/base"
  op_base=$(cat "$op_dir/base")
  { awk '{ print "void " $1 "(void);\nvoid " $1 "(void) {}" }' "$op_dir/names"; } >"$op_dir/stub.c"
  printf '%s { global: hk_*; local: *; };\n' "$op_base" >"$op_dir/stub.map"
  { awk '{ print "void " $1 "(void);" }' "$op_dir/names"
    echo 'int main(int argc, char **argv) {'
    echo '  (void)argv;'
    echo '  if (argc > 99) {'
    awk '{ print "    " $1 "();" }' "$op_dir/names"
    echo '  }'
    echo '  return 0;'
    echo '}'; } >"$op_dir/prog.c"
  op_n=$(wc -l <"$op_dir/names")
  if ${CC:-cc} -shared -fPIC -o "$op_dir/$2" -Wl,-soname,"$2" -Wl,--version-script="$op_dir/stub.map" \
       "$op_dir/stub.c" &&
     ${CC:-cc} -o "$op_dir/prog" "$op_dir/prog.c" "$op_dir/$2" &&
     LD_BIND_NOW=1 LD_LIBRARY_PATH="$BUILD/lib" "$op_dir/prog"; then
    echo "abi: $3: a program linked before the version nodes ($op_n functions, each @$op_base) starts"
    op_rc=0
  else
    echo "abi: $3: a program linked before the version nodes (each function @$op_base) does not start"
    op_rc=1
  fi
  rm -rf "$op_dir"
  return $op_rc
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
    versions "$base" "$so" "$lib" || status=1
  fi
  nodes "$so" "$lib"
  old_programs "pkg/$(echo "$lib" | sed 's/^lib//').map" "$lib.so.$MAJOR" "$lib" || status=1
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
