#!/bin/sh
# Writes hotkern(3), the C API reference, on stdout, made from the public
# headers: hotkern.h's opening comment is the description, each of its
# "---- name ----" sections a subsection, and in each, what the header
# declares (prototypes, types, each structure's and enum's fields) with the
# comment that documents it; then net.h and interpose.h the same way.
#   sh scripts/man3.sh >docs/man/hotkern.3   (make man)
# `make lint` fails when docs/man/hotkern.3 is not what this writes.
set -eu
cd "$(dirname "$0")/.."
version=$(awk '/define HK_VERSION_(MAJOR|MINOR|PATCH)/ {printf "%s%s", sep, $3; sep="."}' \
  include/hotkern/hotkern.h)

# doc HEADER TITLE [AFTER]: the header's opening comment (under .SH TITLE
# unless TITLE is empty, when it follows the current heading), then .SH AFTER
# when given, and the header's declarations.
doc() {
  awk -v title="$2" -v after="${3-}" '
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
  function flush_field() {
    if (fdecl == "" && fn == 0) return
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
  BEGIN { top = 1; gn = 0; dn = 0; depth = 0; skip = 0; sp = 0 }
  # The opening comment: the description.
  top {
    t = cline($0)
    if ($0 !~ /^\/\*[ \t]*$/ && $0 !~ /^[ \t]*\*\/[ \t]*$/) tc[++tn] = t
    if ($0 ~ /\*\//) {
      if (title != "") print ".SH \"" title "\""
      prose(tn, tc); top = 0
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
  /^#[ \t]*(include|undef)/ || /^#define HOTKERN_/ || /clang-format (on|off)/ { next }
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
EOF
printf '.SH DESCRIPTION\n'
doc include/hotkern/hotkern.h "" "THE ENGINE (hotkern.h)"
doc include/hotkern/net.h "NETWORK SOURCES (net.h)"
doc include/hotkern/interpose.h "EXISTING PROGRAMS (interpose.h)"
cat <<EOF
.SH SEE ALSO
.BR hotkern (1);
include/hotkern/hotkern.hpp, typed launches from C++ (header-only, beside
these headers).
EOF
