#!/bin/sh
# Links a shared library's objects into one relocatable object whose public
# functions carry the version nodes of its version script (pkg/*.map):
#   sh scripts/symver.sh MAP OUT OBJ...
# Each function NAME the map lists in node NODE becomes NAME@@NODE, its
# default version. The map's "@compat BASE: NODE..." line names the single
# node of the releases before they had one each: every function of those
# nodes also gets NAME@BASE, at the same address, so that a program linked
# against such a release (which asks for NAME@BASE) finds it.
#
# Why a step of its own: the GNU toolchain versions a symbol in the object
# that defines it (.symver, the symver attribute), which would put one line
# per function into the source files; and ld drops the plain NAME of an
# object that also defines NAME@BASE, so the default version is named
# explicitly too. Both names are put on the combined object with objcopy,
# the way the assembler's .symver writes them. The internal calls keep
# going through the default name, as before (through the PLT, so an
# LD_PRELOAD'ed copy of a function still takes them). The aliases have no
# size (objcopy cannot give one): the dynamic linker does not read it, and
# a debugger names the address by the default symbol, which has it.
#
# Fails when the map lists a function the objects do not define, or when the
# objects export an hk_ function the map does not list: a new function must
# be given its release's node.
set -eu
[ $# -ge 3 ] || { echo "usage: $0 MAP OUT OBJ..." >&2; exit 2; }
map=$1
out=$2
shift 2
tmp=$out.tmp
trap 'rm -f "$tmp" "$tmp.sec" "$tmp.syms" "$tmp.want" "$tmp.args"' EXIT

${LD:-ld} -r -o "$tmp" "$@"

# NODE NAME, one line per function the map lists, comments dropped; then
# "compat BASE NODE..." from the @compat line.
awk '
  /^[ \t*]*@compat[ \t]+[A-Z_0-9]+:/ { line = $0; sub(/.*@compat[ \t]*/, "", line); sub(/:/, "", line)
              print "compat " line; next }
  { sub(/\/\*.*\*\//, "") }
  /\/\*/ { incomment = 1; next }
  incomment { if ($0 ~ /\*\//) incomment = 0; next }
  /^[A-Za-z_][A-Za-z0-9_.]* *\{/ { node = $1; next }
  /^\}/ { node = ""; next }
  node != "" && /^ *[a-z_][a-z0-9_]* *;/ { name = $1; sub(/;/, "", name); print node, name }
' "$map" >"$tmp.want"

# NAME SECTION VALUE TYPE of every global, default-visibility symbol the
# object defines.
readelf -SW "$tmp" | sed -n 's/^ *\[ *\([0-9]*\)\] \([^ ]*\) .*/\1 \2/p' >"$tmp.sec"
readelf -sW "$tmp" | awk 'NR == FNR { sec[$1] = $2; next }
  $5 == "GLOBAL" && $6 == "DEFAULT" && $7 ~ /^[0-9]+$/ { print $8, sec[$7], $2, $4 }' \
  "$tmp.sec" - >"$tmp.syms"

awk -v map="$map" '
  NR == FNR {
    if ($1 == "compat") { base = $2; for (i = 3; i <= NF; i++) old[$i] = 1; next }
    if ($2 in node) { printf "%s: %s is in two nodes\n", map, $2 > "/dev/stderr"; bad = 1 }
    node[$2] = $1; next
  }
  { defined[$1] = 1 }
  $1 ~ /^hk_/ && !($1 in node) {
    printf "%s: %s is exported but in no version node (add it to the next release'"'"'s)\n", \
      map, $1 > "/dev/stderr"; bad = 1
  }
  $1 in node {
    print "--redefine-sym"; print $1 "=" $1 "@@" node[$1]
    if (node[$1] in old) {
      kind = ($4 == "OBJECT") ? "object" : "function"
      print "--add-symbol"; print $1 "@" base "=" $2 ":0x" $3 ",global," kind
    }
  }
  END {
    for (n in node) if (!(n in defined)) {
      printf "%s: %s is listed but not defined\n", map, n > "/dev/stderr"; bad = 1
    }
    exit bad
  }' "$tmp.want" "$tmp.syms" >"$tmp.args"

# One argument a line (no name or section holds a space).
set --
while IFS= read -r arg; do set -- "$@" "$arg"; done <"$tmp.args"
objcopy "$@" "$tmp" "$out"
