#!/bin/sh
# Writes the C API's man pages, made from the public headers
# (include/hotkern/*.h), into DIR:
#   hotkern.3        the whole reference: hotkern.h's opening comment is the
#                    description, each "---- name ----" section a
#                    subsection, and in each, what the header declares
#                    (prototypes, types, each structure's and enum's fields)
#                    with the comment that documents it; then the topic
#                    headers hotkern.h includes, net.h and interpose.h, each
#                    under a heading of its own;
#   hotkern-PAGE.3   one page per subject: a topic header's sections
#                    (hotkern-watch.3 ...), or one of hotkern.h's own
#                    (hotkern-swap.3 ...: page_of names them), with the
#                    functions' versions (their "Since" lines);
#   hk_NAME.3        for each public function, structure and enum, a link
#                    (.so) to the page that documents it, so that
#                    `man hk_swap` finds it.
# A field whose comment in the header is short has its whole description in
# docs/man/fields.txt, printed in its place.
#   sh scripts/man3.sh docs/man/man3   (make man; stale pages are removed)
# `make lint` fails when docs/man/man3 is not what this writes.
set -eu
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
dir=$1
cd "$(dirname "$0")/.."
case $dir in /*) ;; *) dir=$OLDPWD/$dir ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
FIELDS=docs/man/fields.txt
version=$(awk '/define HK_VERSION_(MAJOR|MINOR|PATCH)/ {printf "%s%s", sep, $3; sep="."}' \
  include/hotkern/hotkern.h)

# doc HEADER TITLE [AFTER]: the header's opening comment (under .SH TITLE
# unless TITLE is empty, when it follows the current heading), then .SH AFTER
# when given, and the header's declarations. Comment lines mark where the
# subject pages cut it: .\"@@intro after the opening comment, and
# .\"@@section NAME before each section.
doc() {
  awk -v title="$2" -v after="${3-}" -v fields="$FIELDS" -v used="$tmp/used" '
  function esc(s) {
    gsub(/\\/, "\\e", s)
    if (s ~ /^[.\047]/) s = "\\&" s
    return s
  }
  function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
  # A comment line without its "/*", "*" or "*/".
  function cline(s) {
    sub(/^[ \t]*\/\*+ ?/, "", s); sub(/^[ \t]*\*+\/[ \t]*$/, "", s); sub(/^[ \t]*\* ?/, "", s)
    sub(/[ \t]*\*\/[ \t]*$/, "", s)
    return s
  }
  # Comment text as roff: filled paragraphs; a "- " item starts an indented
  # paragraph; lines laid out in columns, or code, stay as they are, with
  # the lines indented deeper that follow them.
  # (A paragraph is one input line, so that a line of the header ending in
  # "e.g." does not end a sentence.)
  function out(s) { if (s != "") { para = para (para == "" ? "" : " ") s; return } \
    if (para != "") print para; para = "" }
  function prose(n, lines,   i, s, body, ind, nf, prev, previnf, item) {
    nf = 0; prev = ""; item = 0; para = ""
    for (i = 1; i <= n; i++) {
      s = lines[i]; body = trim(s)
      match(s, /^ */); ind = RLENGTH
      if (body != "" && (nf || body ~ /^- /)) out("")
      if (body == "") {
        out("")
        if (nf) { print ".fi"; nf = 0 }
        if (item) print ".PP"
        else if (prev != "") print ".sp"
        prev = ""; item = 0
        continue
      }
      cont = (prev != "" && !nf && ind == previnf)
      if ((nf && ind > nfind) || ind >= 2 && body !~ /^- / && !(item && ind == item) && \
          (body ~ /[^ ]  +[^ ]/ || !cont && (body ~ /[;{}\\]$/ || body ~ /\/\// || body ~ /^[#$]/))) {
        out("")
        if (!nf) { print ".nf"; nf = 1; nfind = ind }
        print esc(s)
        prev = body; previnf = ind
        continue
      }
      if (nf) { print ".fi"; nf = 0 }
      if (body ~ /^- /) {
        print ".IP \\(bu 2"
        body = substr(body, 3); item = ind + 2
      } else if (item && ind < item) {
        out(""); print ".PP"; item = 0
      } else if (prev != "" && ind != previnf && (prev ~ /[.:)]$/ || length(prev) < 40)) {
        out(""); print ".br"
      }
      out(esc(body))
      prev = body; previnf = ind
    }
    out("")
    if (nf) print ".fi"
    if (item) print ".PP"
  }
  # A declaration in bold, filled (it wraps at its spaces).
  function decl(s) {
    gsub(/HK_API /, "", s); gsub(/ HK_PRINTF\([0-9, ]*\)/, "", s)
    gsub(/[ \t]+/, " ", s); s = trim(s)
    print "\\fB" esc(s) "\\fR"
  }
  # The field a declaration names ("HK_STAGE_AUTO = 2," "char canary[160];").
  function field_name(d,   w, n) {
    sub(/=.*/, "", d); sub(/\[.*/, "", d); sub(/[;,][ \t]*$/, "", d)
    n = split(trim(d), w, /[ \t*]+/)
    return w[n]
  }
  function flush_field(   key, i) {
    if (fdecl == "" && fn == 0) return
    # The whole description, when the header gives a short one.
    key = sname "." field_name(fdecl)
    if (fdecl != "" && (key in long)) {
      fn = split(long[key], fc, "\n")
      print key >>used
    }
    # A field without a comment goes on a line of its own, below the last.
    if (fn == 0) print (bare ? ".br" : ".PP")
    else if (fdecl != "") print ".TP"
    else print ".PP"
    if (fdecl != "") decl(fdecl)
    if (fn) prose(fn, fc)
    bare = (fn == 0)
    fdecl = ""; fn = 0; fdone = 0
  }
  # The group read so far: its comment, then what it describes.
  function flush() {
    if (gn == 0 && dn == 0 && !body) return
    print ".PP"
    for (k = 1; k <= dn; k++) { decl(ds[k]); if (k < dn) print ".br" }
    if (gn) {
      if (dn) print ".RS 4"
      prose(gn, gc)
      if (dn) print ".RE"
    }
    gn = 0; dn = 0
  }
  BEGIN {
    top = 1; gn = 0; dn = 0; depth = 0; skip = 0; sp = 0
    while ((getline line <fields) > 0) {
      if (line ~ /^#/ || line ~ /^[ \t]*$/) continue
      if (line ~ /^[A-Za-z_]/) { k = line; long[k] = ""; continue }
      sub(/^  /, "", line)
      long[k] = long[k] (long[k] == "" ? "" : "\n") line
    }
    close(fields)
  }
  # The opening comment: the description.
  top {
    t = cline($0)
    if ($0 !~ /^\/\*[ \t]*$/ && $0 !~ /^[ \t]*\*\/[ \t]*$/) tc[++tn] = t
    if ($0 ~ /\*\//) {
      if (title != "") print ".SH \"" title "\""
      prose(tn, tc); top = 0
      print ".\\\"@@intro"
      if (after != "") print ".SH \"" after "\""
    }
    next
  }
  # Preprocessor: the include guard, extern "C" and the HK_API and C++
  # alternatives are not the API.
  /^#[ \t]*if/ {
    st[++sp] = ($0 ~ /defined\(/ || $0 ~ /^#ifdef __cplusplus/) ? "skip" : \
               ($0 ~ /^#ifndef __cplusplus/) ? "keepelse" : "keep"
    next
  }
  /^#[ \t]*else/ { if (st[sp] == "keepelse") st[sp] = "skip"; next }
  /^#[ \t]*endif/ { sp--; next }
  { for (i = 1; i <= sp; i++) if (st[i] == "skip") next }
  # (A comment right above #include lines is about the header itself.)
  /^#[ \t]*include/ { if (dn == 0) gn = 0; next }
  /^#[ \t]*undef/ || /^#define HOTKERN_/ || /clang-format (on|off)/ { next }
  # The error table: one entry per code.
  /^#define HK_ERROR_TABLE/ { flush(); print ".RS 4"; errs = 1; en = 0; next }
  errs {
    line = $0; sub(/[ \t]*\\$/, "", line)
    if (line ~ /\/\*/) { etext = trim(cline(line)); next }
    if (match(line, /X\(HK_[A-Z_]+, *-?[0-9]+, *".*"\)/)) {
      e = substr(line, RSTART + 2, RLENGTH - 3)
      name = e; sub(/,.*/, "", name)
      val = e; sub(/^[^,]*, */, "", val); sub(/,.*/, "", val)
      msg = e; sub(/^[^"]*"/, "", msg); sub(/"$/, "", msg)
      sub(/^-/, "\\-", val)
      print ".TP"
      print "\\fB" name "\\fR (" val "): " esc(msg)
      print (etext != "" ? esc(etext) : "\\&")
      etext = ""
    }
    if ($0 !~ /\\$/) { errs = 0; print ".RE" }
    next
  }
  /^enum hk_error \{/ { skipenum = 1; next }
  skipenum { if ($0 ~ /^\};/) skipenum = 0; next }
  # A section.
  /^\/\* ---- .* -+ \*\/$/ {
    flush()
    s = $0; sub(/^\/\* ---- /, "", s); sub(/ -+ \*\/$/, "", s)
    print ".\\\"@@section " s
    print ".SS \"" toupper(substr(s, 1, 1)) substr(s, 2) "\""
    next
  }
  # Inside a structure or enum: its fields.
  body {
    line = $0
    if (line ~ /^\}/) {
      flush_field()
      print ".RE"
      print "\\fB" esc(trim(line)) "\\fR"
      body = 0
      next
    }
    if (fin) {
      fc[++fn] = cline(line); if (line ~ /\*\//) fin = 0
      next
    }
    c = index(line, "/*")
    d = c ? substr(line, 1, c - 1) : line
    if (trim(d) != "") {
      if (fdone) flush_field()
      fdecl = fdecl " " d; fdone = (d ~ /[;,][ \t]*$/)
    } else if (fdone && fn) flush_field()
    if (c) {
      fc[++fn] = cline(substr(line, c)); fin = (substr(line, c) !~ /\*\//)
    }
    next
  }
  # A static inline function: its prototype only.
  inl {
    if ($0 ~ /^\}/) inl = 0
    next
  }
  /^static inline .*\{$/ {
    s = $0; sub(/[ \t]*\{$/, ";", s); ds[++dn] = s; inl = 1
    next
  }
  /^[ \t]*$/ { if (!pend) flush(); next }
  # A comment at the outer level: a new group.
  !pend && /^[ \t]*\/\*/ {
    if (dn || gn) flush()
    gc[++gn] = cline($0); gin = ($0 !~ /\*\//)
    next
  }
  gin { gc[++gn] = cline($0); if ($0 ~ /\*\//) gin = 0; next }
  # Declarations, up to their ";" (or the end of a #define).
  /^(typedef )?(struct|enum) [a-z_0-9]* ?\{$/ {
    if (dn) flush()
    sname = ($1 == "typedef") ? $3 : $2
    print ".PP"
    decl($0)
    if (gn) { print ".RS 4"; prose(gn, gc); print ".RE" }
    gn = 0
    print ".RS 4"
    body = 1; fdecl = ""; fn = 0; fin = 0; fdone = 0; bare = 0
    next
  }
  {
    pend = pend (pend == "" ? "" : " ") $0
    if ($0 ~ /;[ \t]*(\/\*.*)?$/ || ($0 ~ /^#define/ && $0 !~ /\\$/) || (pend ~ /^#define/ && $0 !~ /\\$/)) {
      p = pend; sub(/[ \t]*\/\*.*$/, "", p); ds[++dn] = p; pend = ""
    }
  }
  END { flush() }
  ' "$1"
}

# The topic headers, in the order hotkern.h includes them, and the title of
# each in hotkern(3).
TOPICS="launch check canary lkg metrics watch"
topic_title() {
  case $1 in
    launch) echo "KERNELS AND LAUNCHES (launch.h)" ;;
    check) echo "CHECKING WITHOUT A GPU (check.h)" ;;
    canary) echo "CANARY RUNS (canary.h)" ;;
    lkg) echo "LAST KNOWN GOOD (lkg.h)" ;;
    metrics) echo "METRICS (metrics.h)" ;;
    watch) echo "WATCHED DIRECTORIES (watch.h)" ;;
    *) echo "man3: include/hotkern/$1.h has no title (scripts/man3.sh, topic_title)" >&2; exit 1 ;;
  esac
}

# page_of HEADER SECTION: the page (hotkern-PAGE.3) that documents a section.
# A topic header is one page; hotkern.h's sections each name theirs here.
page_of() {
  case $1 in
    hotkern/hotkern.h)
      case $2 in
        version) echo version ;;
        errors) echo errors ;;
        "kernel image formats") echo formats ;;
        reports) echo reports ;;
        runtime) echo runtime ;;
        "logs (the type"* | "logs and queued events") echo log ;;
        "swapping in new versions") echo swap ;;
        counters) echo stats ;;
        *) echo "man3: hotkern.h: section '$2' has no page (scripts/man3.sh, page_of)" >&2
           exit 1 ;;
      esac ;;
    *) h=${1#hotkern/}; echo "${h%.h}" ;;
  esac
}

# What each page is about: its NAME line, after the functions.
page_about() {
  case $1 in
    version) echo "the version of hotkern" ;;
    errors) echo "hotkern's error codes" ;;
    formats) echo "the kernel image formats hotkern takes" ;;
    reports) echo "what a hotkern call reports" ;;
    runtime) echo "a hotkern runtime and its options" ;;
    log) echo "hotkern's logs and queued events" ;;
    swap) echo "swap new versions of a module in, roll them back" ;;
    stats) echo "a hotkern runtime's counters" ;;
    launch) echo "kernel handles, launches, their attributes and CUDA graphs" ;;
    check) echo "check a kernel source without a GPU" ;;
    canary) echo "test launches of a new version in a canary process" ;;
    lkg) echo "last known good: restart on a version that ran cleanly" ;;
    metrics) echo "hotkern's metrics in the Prometheus text format" ;;
    watch) echo "watched directories as a source of versions" ;;
    net) echo "signed releases pushed over HTTP or pulled from an origin" ;;
    interpose) echo "hot reload for programs as they are (<<<>>> launches)" ;;
    *) echo "man3: page $1 has no description (scripts/man3.sh, page_about)" >&2; exit 1 ;;
  esac
}

# The library a header's functions are in, as the SYNOPSIS says it.
link_of() {
  case $1 in
    hotkern/net.h) printf '%s\n' 'Link with libhotkern\-net, which links libhotkern' \
      '.RB ( "pkg\-config \-\-cflags \-\-libs hotkern\-net" ;' \
      '.B find_package(hotkern COMPONENTS net)' 'and' '.BR hotkern::net ).' ;;
    hotkern/interpose.h) printf '%s\n' \
      'Defined by libhotkern\-preload.so (LD_PRELOAD) and libhotkern\-wrap.a' \
      '.RB ( "pkg\-config \-\-variable=nvcc_libs hotkern\-wrap" ;' \
      '.BR hotkern_enable_hot_reload() ).' ;;
    *) printf '%s\n' 'Link with libhotkern' \
      '.RB ( "pkg\-config \-\-cflags \-\-libs hotkern" ;' '.B find_package(hotkern)' 'and' \
      '.BR hotkern::hotkern ).' ;;
  esac
}

TAB=$(printf '\t')
# Every public function: HEADER SECTION NAME SINCE (scripts/api.sh), and every
# structure and enum with a body: HEADER SECTION NAME.
sh scripts/api.sh >"$tmp/functions"
for h in include/hotkern/*.h; do
  awk -v header="${h#include/}" '
    /^\/\* ---- .* -+ \*\/$/ { s = $0; sub(/^\/\* ---- /, "", s); sub(/ -+ \*\/$/, "", s) }
    /^typedef (struct|enum) [a-z_0-9]+ \{$/ { printf "%s\t%s\t%s\n", header, s == "" ? "-" : s, $3 }' "$h"
done >"$tmp/types"
: >"$tmp/used"

# Which page each function and type is on: PAGE NAME [SINCE].
while IFS="$TAB" read -r h sec name since; do
  printf '%s\t%s\t%s\n' "$(page_of "$h" "$sec")" "$name" "$since"
done <"$tmp/functions" >"$tmp/fpages"
while IFS="$TAB" read -r h sec name; do
  printf '%s\t%s\n' "$(page_of "$h" "$sec")" "$name"
done <"$tmp/types" >"$tmp/tpages"
# (page_of said why when a section has no page.)
! cut -f1 "$tmp/fpages" "$tmp/tpages" | grep -qx '' || exit 1

# 1. hotkern(3).
{
  cat <<EOF
.\\" hotkern(3), written by scripts/man3.sh from the public headers
.\\" include/hotkern/*.h: change the headers, then \`make man\`.
.TH HOTKERN 3 "" "hotkern $version" "Library Functions Manual"
.nh
.ad l
.SH NAME
hotkern \\- replace CUDA kernels inside a running program (the C API)
.SH SYNOPSIS
.nf
.B #include <hotkern/hotkern.h>
.B #include <hotkern/net.h>
.B #include <hotkern/interpose.h>
.fi
.PP
The engine, builds and watcher are libhotkern
.RB ( "pkg\\-config \\-\\-cflags \\-\\-libs hotkern" ,
or from CMake
.B find_package(hotkern)
and the targets
.B hotkern::hotkern
or
.BR hotkern::hotkern_static );
the network sources of net.h are libhotkern\\-net, which links libhotkern
.RB ( "pkg\\-config ... hotkern\\-net" ,
.B find_package(hotkern COMPONENTS net)
and
.B hotkern::net
or
.BR hotkern::net_static ).
interpose.h is defined by libhotkern\\-preload.so (LD_PRELOAD) and
libhotkern\\-wrap.a
.RB ( "pkg\\-config ... hotkern\\-wrap" ,
.BR hotkern_enable_hot_reload() ).
.PP
Each function, structure and enum also has a page of its name
.RB ( "man hk_swap" ):
the page of its subject, which SEE ALSO lists.
EOF
  printf '.SH DESCRIPTION\n'
  doc include/hotkern/hotkern.h "" "THE ENGINE (hotkern.h)"
  for t in $TOPICS; do
    doc "include/hotkern/$t.h" "$(topic_title "$t")"
  done
  doc include/hotkern/net.h "NETWORK SOURCES (net.h)"
  doc include/hotkern/interpose.h "EXISTING PROGRAMS (interpose.h)"
  printf '%s\n' ".SH SEE ALSO" ".BR hotkern (1),"
  cut -f1 "$tmp/fpages" "$tmp/tpages" | awk '!seen[$0]++ { printf "%s.BR hotkern\\-%s (3)", sep, $0; sep = ",\n" }
    END { print ";" }'
  cat <<EOF
include/hotkern/hotkern.hpp, typed launches from C++ (header-only, beside
these headers).
EOF
} | grep -v '^\.\\"@@' >"$tmp/hotkern.3"

# 2. The subject pages: each header's text cut at its sections, each part
# added to its page in the headers' order; a topic header's page opens with
# the header's own comment.
mkdir "$tmp/parts"
for h in hotkern $TOPICS net interpose; do
  doc "include/hotkern/$h.h" "" | awk -v dir="$tmp/parts" -v h="$h" '
    BEGIN { part = "intro"; printf "" >(dir "/" h ".intro"); printf "" >(dir "/" h ".pre") }
    /^\.\\"@@intro$/ { part = "pre"; next }
    /^\.\\"@@section / { n++; part = sprintf("%03d", n); t = $0; sub(/^[^ ]* /, "", t)
                         print t >(dir "/" h "." part ".title"); next }
    { print >(dir "/" h "." part) }'
  if [ "$h" != hotkern ]; then
    page=$(page_of "hotkern/$h.h" "")
    cat "$tmp/parts/$h.intro" "$tmp/parts/$h.pre" >"$tmp/body.$page"
    printf '%s\n' "$h" >"$tmp/header.$page"
  fi
  for f in "$tmp/parts/$h".[0-9]*.title; do
    [ -f "$f" ] || continue
    page=$(page_of "hotkern/$h.h" "$(cat "$f")")
    cat "${f%.title}" >>"$tmp/body.$page"
    printf '%s\n' "$h" >"$tmp/header.$page"
  done
done

for b in "$tmp"/body.*; do
  page=${b##*/body.}
  h=$(cat "$tmp/header.$page")
  names=$(awk -F '\t' -v p="$page" '$1 == p { printf "%s%s", sep, $2; sep = ", " }' \
    "$tmp/fpages")
  [ -n "$names" ] ||
    names=$(awk -F '\t' -v p="$page" '$1 == p { printf "%s%s", sep, $2; sep = ", " }' \
      "$tmp/tpages")
  [ -n "$names" ] || { echo "man3: page $page documents nothing" >&2; exit 1; }
  upper=$(printf '%s' "$page" | tr '[:lower:]' '[:upper:]')
  {
    printf '%s\n' ".\\\" hotkern-$page(3), written by scripts/man3.sh from the public headers" \
      ".\\\" include/hotkern/*.h: change the headers, then \`make man\`." \
      ".TH HOTKERN\\-$upper 3 \"\" \"hotkern $version\" \"Library Functions Manual\"" \
      .nh ".ad l" ".SH NAME"
    printf '%s \\- %s\n' "$names" "$(page_about "$page")"
    printf '%s\n' ".SH SYNOPSIS" .nf ".B #include <hotkern/$h.h>" .fi .PP
    link_of "hotkern/$h.h"
    printf '.SH DESCRIPTION\n'
    cat "$b"
    # The version that added each function, from its "Since" line.
    if awk -F '\t' -v p="$page" '$1 == p { found = 1 } END { exit !found }' "$tmp/fpages"; then
      printf '.SH VERSIONS\n'
      awk -F '\t' -v p="$page" '$1 == p { v[$3] = v[$3] (v[$3] == "" ? "" : ", ") $2 }
        END { for (k in v) print k "\t" v[k] }' "$tmp/fpages" | sort -t . -k1,1n -k2,2n |
        while IFS="$TAB" read -r since list; do
          printf '%s\n' .TP ".B hotkern $since" "$list"
        done
      [ "$h" = interpose ] || printf '%s\n' .PP \
        "Each function of the library is exported under the symbol version of the" \
        "release that added it (HOTKERN_1.0 for 1.0; HOTKERN_NET_1.0 in" \
        "libhotkern\\-net), which a program linked against it asks for; those of" \
        "1.0 to 1.3 also under HOTKERN_1 (HOTKERN_NET_1), the one version of those" \
        "releases, for programs linked then. The static inline functions are the" \
        "headers' own."
    fi
    printf '%s\n' ".SH SEE ALSO" ".BR hotkern (3),"
    printf '%s\n' ".BR hotkern\\-version (3)."
  } >"$tmp/hotkern-$page.3"
done

# 3. A link page per function and type.
cut -f1,2 "$tmp/fpages" "$tmp/tpages" | while IFS="$TAB" read -r page name; do
  printf '.so man3/hotkern-%s.3\n' "$page" >"$tmp/$name.3"
done

# Every entry of docs/man/fields.txt was printed.
awk 'NR == FNR { used[$0] = 1; next }
     /^[A-Za-z_]/ && !($0 in used) {
       print "man3: " FILENAME ": " $0 " names no field of the headers" >"/dev/stderr"; bad = 1 }
     END { exit bad }' "$tmp/used" "$FIELDS"

# Into DIR: every page written, none left over.
mkdir -p "$dir"
for f in "$dir"/*.3; do
  [ ! -f "$f" ] || [ -f "$tmp/${f##*/}" ] || rm -f "$f"
done
for f in "$tmp"/*.3; do
  cmp -s "$f" "$dir/${f##*/}" 2>/dev/null || cp "$f" "$dir/${f##*/}"
done
