#!/bin/sh
# The public functions of the C headers (include/hotkern/*.h), one line each:
#   HEADER<TAB>SECTION<TAB>NAME<TAB>SINCE
# SECTION is the "---- name ----" section the declaration is in ("-" before
# the first), SINCE the "Since MAJOR.MINOR" of its doc comment ("" when it
# has none). A doc comment is the comment right above a declaration, or
# above the group of declarations it starts (no blank line between them).
# Public functions: the HK_API declarations and the static inline ones.
#   sh scripts/api.sh           the list (scripts/man3.sh reads it)
#   sh scripts/api.sh --check   `make lint`: fails on a public function
#                               without a Since line, on a Since later than
#                               the headers' version, on a function whose
#                               symbol version (pkg/*.map) is another release,
#                               on a C++ header (header-only) without a
#                               Since line in its opening comment, and on a
#                               field comment of more than two lines
set -eu
cd "$(dirname "$0")/.."
MODE=${1-list}

list() {
  for h in include/hotkern/*.h; do
    awk -v header="${h#include/}" '
      function flush_comment() { comment = ""; incomment = 0 }
      # A declaration ends at its ";" (or, inline, at the "{" of its body,
      # whose lines up to the closing "}" are skipped).
      BEGIN { section = ""; comment = ""; indecl = 0; inbody = 0 }
      inbody { if ($0 ~ /^\}/) inbody = 0; next }
      incomment {
        comment = comment " " $0
        if ($0 ~ /\*\//) incomment = 0
        next
      }
      /^\/\* ---- .* -+ \*\/$/ {
        section = $0; sub(/^\/\* ---- /, "", section); sub(/ -+ \*\/$/, "", section)
        flush_comment(); group = 0; next
      }
      /^[ \t]*$/ { flush_comment(); group = 0; next }
      /^[ \t]*\/\*/ && !indecl {
        # A comment after a declaration starts a new group.
        if (group) { comment = ""; group = 0 }
        comment = comment " " $0
        if ($0 !~ /\*\//) incomment = 1
        next
      }
      /^(HK_API|static inline) / || indecl {
        text = indecl ? text " " $0 : $0
        if ($0 ~ /[;{][ \t]*(\/\*.*)?$/) {
          d = text; sub(/\(.*/, "", d); n = split(d, w, /[ \t*]+/); name = w[n]
          since = ""
          if (match(comment, /Since [0-9]+\.[0-9]+/)) since = substr(comment, RSTART + 6, RLENGTH - 6)
          printf "%s\t%s\t%s\t%s\n", header, section == "" ? "-" : section, name, since
          indecl = 0; group = 1
          if ($0 ~ /\{[ \t]*$/) inbody = 1
        } else indecl = 1
        next
      }
      # Any other declaration (a type, a macro) ends the group.
      { if (!incomment) { comment = ""; group = 0 } }
    ' "$h"
  done
}

if [ "$MODE" = list ]; then
  list
  exit 0
fi
[ "$MODE" = --check ] || { echo "usage: $0 [--check]" >&2; exit 2; }

version=$(awk '/define HK_VERSION_(MAJOR|MINOR)/ {printf "%s%s", sep, $3; sep="."}' \
  include/hotkern/hotkern.h)
# NAME RELEASE of every function the version scripts put in a release's node.
nodes=$(awk '
  /^[A-Z_]+_[0-9]+\.[0-9]+ *\{/ { node = $1; sub(/^[A-Z_]+_/, "", node); next }
  /^\}/ { node = "" }
  node != "" && /^ *hk_[a-z0-9_]* *;/ { name = $1; sub(/;/, "", name); print name, node }
' pkg/hotkern.map pkg/hotkern-net.map)
status=0
problems=$(list | awk -F '\t' -v version="$version" -v nodes="$nodes" '
  function newer(a, b,   x, y) { split(a, x, "."); split(b, y, ".")
    return x[1] + 0 > y[1] + 0 || (x[1] + 0 == y[1] + 0 && x[2] + 0 > y[2] + 0) }
  BEGIN { n = split(nodes, l, "\n"); for (i = 1; i <= n; i++) { split(l[i], p, " "); node[p[1]] = p[2] } }
  {
    where = "include/" $1 ": " $3
    seen[$3] = 1
    if ($4 == "") { print where ": no \"Since MAJOR.MINOR\" in its doc comment"; bad = 1; next }
    if (newer($4, version)) { print where ": Since " $4 ", after the headers'"'"' " version; bad = 1 }
    if (($3 in node) && node[$3] != $4) {
      print where ": Since " $4 ", but pkg/*.map exports it in the node of " node[$3]; bad = 1
    }
  }
  END {
    for (f in node) if (!(f in seen)) { print "pkg/*.map: " f " is in no public header"; bad = 1 }
    exit bad
  }') || status=1
# A field's (or enumerator's) comment is a line or two; the whole text goes
# to docs/man/fields.txt, which the man pages print.
long=$(for h in include/hotkern/*.h; do
  awk -v h="$h" '
    /^(typedef )?(struct|enum) [a-z_0-9]* ?\{$/ { body = 1; next }
    body && /^\}/ { body = 0; next }
    body && n { n++; if ($0 ~ /\*\//) { if (n > 2) print h ":" start ": a field comment of " n \
                " lines (two at most: the whole text goes to docs/man/fields.txt)"; n = 0 }; next }
    body && /[^ \t].*\/\*/ && $0 !~ /^[ \t]*\/\*/ && $0 !~ /\*\// { n = 1; start = NR }' "$h"
done)
[ -z "$long" ] || { problems="$problems${problems:+
}$long"; status=1; }
# The C++ header is header-only and says its version once, at the top.
for h in include/hotkern/*.hpp; do
  sed -n '1,/\*\//p' "$h" | grep -q 'Since [0-9][0-9]*\.[0-9][0-9]*' ||
    { problems="$problems${problems:+
}$h: no \"Since MAJOR.MINOR\" in its opening comment"; status=1; }
done
[ -z "$problems" ] || printf '%s\n' "$problems" | sed 's/^/lint: /' >&2
exit $status
