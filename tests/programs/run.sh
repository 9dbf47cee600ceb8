#!/bin/sh
# The program shapes (tests/programs/*/), each an ordinary nvcc program with
# nothing of hotkern in it, run as users run them: NAME-shared under
# LD_PRELOAD=libhotkern-preload.so, NAME-static linked with the --wrap flags,
# both with HOTKERN_WATCH on a fresh directory that holds a copy of the file
# under edit. While a program runs, this script edits that copy (one rename
# a save) and reads what the program prints (prog.h): every launch's output is
# checked by the program itself (it ran, it is its own file's code, its values
# are right); here, that each kernel reached the edits it must reach, within
# a bounded wait, and ran no version it must not run (a refused one, another
# file's).
#
#   two_files       a.cu and b.cu: file-local fill() and bias of the same names;
#                   a.cu watched: a's fill follows its edits, b's runs b's code
#                   with b's bias
#   dynsmem64k      a kernel with 64 KB of dynamic shared memory
#                   (cudaFuncSetAttribute) follows its edits, never a no-op
#   registers       an edit needing 128 registers a thread, for 1024-thread
#                   blocks: refused, naming the kernel and the block size; the
#                   next edit, which fits, commits
#   template_late   blur<3>, first launched after an edit committed, runs that
#                   edit without another save
#   cooperative     cudaLaunchCooperativeKernel and <<<>>> of one kernel both
#                   follow the edits
#   graph           a graph captured from <<<>>> (again every 200 frames) runs
#                   a committed version of its file, across two edits
#   threads         two threads launching without pause: every launch ran,
#                   each thread follows three edits
#   plugins         a dlopen'd plugin's kernel follows an edit of its file;
#                   after its dlclose, another plugin (same kernel name, likely
#                   the same addresses) runs its own code, and the first one
#                   dlopen'd again runs its own file's code (-cudart shared
#                   only: a plugin with a static cudart has a runtime of its
#                   own, which no --wrap of the host reaches)
#   exit_mid_build  HK_PROGS_EXIT_RUNS (40) runs a build: the program ends
#                   (return from main, or exit()) 0-200 ms after a save, with
#                   a build in flight: exit status 0, its buffered last line
#                   written
#
# usage: sh tests/programs/run.sh BUILD [CASE...]
# Prints PASS/FAIL/SKIP NAME lines (NAME is CASE.shared or CASE.static) and
# "N passed, N failed, N skipped"; exits 1 when one failed. Without a CUDA
# device each program says so and its case is SKIPped with the reason.
# HK_PROGS_WAIT (20): seconds to wait for an edit to show; HK_PROGS_LOGS: where
# the logs go (kept; by default a temporary directory, kept when one failed).
set -u
BUILD=${1:-build}
[ $# -gt 0 ] && shift
only=" $* "
here=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "$BUILD" && pwd)/programs
preload=$(cd "$BUILD" && pwd)/lib/libhotkern-preload.so
WAIT=${HK_PROGS_WAIT:-20}
EXIT_RUNS=${HK_PROGS_EXIT_RUNS:-40}
PROG_LIMIT=150 # a program's own limit (seconds); then the KILL
KILL_AFTER=180
if [ -n "${HK_PROGS_LOGS:-}" ]; then
  logs=$HK_PROGS_LOGS
  mkdir -p "$logs"
  keep=1
else
  logs=$(mktemp -d /tmp/hotkern-programs-XXXXXX)
  keep=0
fi
passed=0 failed=0 skipped=0
pid='' dir='' out='' err='' why='' label=''

pass() { echo "PASS $1"; passed=$((passed + 1)); }
skip() { echo "SKIP $1: $2"; skipped=$((skipped + 1)); }
fail() {
  echo "FAIL $1: $2"
  failed=$((failed + 1))
  keep=1
  if [ -n "$out" ] && [ -f "$out" ]; then
    echo "  the program's last lines ($out):"
    tail -n 12 "$out" | sed 's/^/    /'
    echo "  hotkern's last lines ($err):"
    grep -E 'hotkern' "$err" | tail -n 8 | sed 's/^/    /'
  fi
}

# alive PID: the process runs (a zombie does not).
alive() {
  [ -r "/proc/$1/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}

# prepare CASE WAY: a fresh directory for one run: watch/ (HOTKERN_WATCH),
# ctl/ (the program's control files), cache/ (its compile cache).
prepare() {
  label=$1.$2
  dir=$logs/$1-$2
  rm -rf "$dir"
  mkdir -p "$dir/watch" "$dir/ctl" "$dir/cache"
  out=$dir/out.log err=$dir/err.log why=
}

# start WAY EXE [ARG...]: the program in the background, as users run it.
start() {
  way=$1 exe=$2
  shift 2
  set -- "$exe" "$dir/ctl" "$PROG_LIMIT" "$@"
  [ "$way" = shared ] && set -- env LD_PRELOAD="$preload" "$@"
  HOTKERN_WATCH="$dir/watch" HOTKERN_CACHE_DIR="$dir/cache" HOTKERN_LOG=info \
    timeout -s KILL "${kill_after:-$KILL_AFTER}" "$@" >"$out" 2>"$err" &
  pid=$!
}

# expect_in FILE PATTERN WHAT [SECONDS] [COUNT]: until FILE has COUNT (1)
# lines matching PATTERN (grep -E). Gives up (sets why, returns 1) after
# SECONDS (HK_PROGS_WAIT), when the program ended, or at its first BAD line;
# does nothing once why is set.
expect_in() {
  [ -n "$why" ] && return 1
  file=$1 pat=$2 what=$3 secs=${4:-$WAIT} count=${5:-1}
  i=0
  while :; do
    n=$(grep -Ec -- "$pat" "$file" 2>/dev/null)
    [ "${n:-0}" -ge "$count" ] && return 0
    if grep -qs '^BAD' "$out"; then
      why="while waiting for $what: $(grep -m 1 '^BAD' "$out")"
      return 1
    fi
    if ! alive "$pid"; then
      n=$(grep -Ec -- "$pat" "$file" 2>/dev/null)
      [ "${n:-0}" -ge "$count" ] && return 0
      why="the program ended before $what"
      return 1
    fi
    if [ $i -ge $((secs * 10)) ]; then
      why="no $what within $secs s"
      return 1
    fi
    sleep 0.1
    i=$((i + 1))
  done
}
expect() { expect_in "$out" "$@"; }

# more_frames N: until the program printed N more "frame" lines (100 frames each).
more_frames() {
  have=$(grep -c '^frame ' "$out" 2>/dev/null)
  expect '^frame ' "$(($1 * 100)) more frames" "$WAIT" $((${have:-0} + $1))
}

# started: waits for the program's start line; 1 when it said SKIP (counted).
started() {
  expect '^(start|SKIP)' "the program's start line" 120 || return 0
  if grep -q '^SKIP' "$out"; then
    wait "$pid"
    skip "$label" "$(sed -n 's/^SKIP [^:]*: //p' "$out" | head -n 1)"
    return 1
  fi
  return 0
}

# save SRC NAME SED-EXPR...: the watched copy dir/watch/NAME becomes SRC with
# the edits applied, saved with one rename; an edit that changes nothing is
# this script's mistake, said as such.
save() {
  [ -n "$why" ] && return 1
  src=$1 name=$2
  shift 2
  cp "$src" "$dir/edit.tmp"
  for e in "$@"; do
    sed "$e" "$dir/edit.tmp" >"$dir/edit.next"
    if cmp -s "$dir/edit.tmp" "$dir/edit.next"; then
      why="run.sh's edit '$e' changes nothing in $src"
      return 1
    fi
    mv "$dir/edit.next" "$dir/edit.tmp"
  done
  mv "$dir/edit.tmp" "$dir/watch/$name"
}

# version N: the sed expression of an edit to version N.
version() { echo "s/^#define VERSION  *0\$/#define VERSION $1/"; }

# finish KERNEL:VERSIONS...: tells the program to stop, waits for it, and
# judges the run: its exit, its BAD lines, and that each KERNEL ran only the
# VERSIONS listed (space-separated).
finish() {
  : >"$dir/ctl/stop"
  wait "$pid"
  rc=$?
  if [ -z "$why" ]; then
    if grep -q '^BAD' "$out"; then
      why=$(grep -m 1 '^BAD' "$out")
    elif [ $rc -eq 137 ]; then
      why="killed after $KILL_AFTER s"
    elif [ $rc -ne 0 ]; then
      why="exit status $rc"
    elif ! tail -n 1 "$out" | grep -q '^done '; then
      why="its last line is not 'done ...'"
    fi
  fi
  for spec in "$@"; do
    k=${spec%%:*} allowed=${spec#*:}
    for v in $(sed -n "s/^seen $k v\([0-9]*\) .*/\1/p" "$out"); do
      case " $allowed " in
        *" $v "*) ;;
        *) [ -z "$why" ] && why="$k ran version $v (it may run: $allowed)" ;;
      esac
    done
  done
  if [ -z "$why" ]; then pass "$label"; else fail "$label" "$why"; fi
}

# ---- the cases: CASE_NAME WAY ------------------------------------------------

case_two_files() {
  prepare two_files "$1"
  cp "$here/two_files/a.cu" "$dir/watch/a.cu"
  start "$1" "$bin/two_files-$1"
  started || return 0
  expect '^seen a\.fill v0' "a.fill's first frame"
  expect '^seen b\.fill v0' "b.fill's first frame"
  save "$here/two_files/a.cu" a.cu "$(version 1)"
  expect '^seen a\.fill v1' "a.fill running the edit of a.cu (v1)"
  save "$here/two_files/a.cu" a.cu "$(version 2)"
  expect '^seen a\.fill v2' "a.fill running the second edit of a.cu (v2)"
  more_frames 3
  finish "a.fill:0 1 2" "b.fill:0"
}

case_dynsmem64k() {
  prepare dynsmem64k "$1"
  cp "$here/dynsmem64k/tile.cu" "$dir/watch/tile.cu"
  start "$1" "$bin/dynsmem64k-$1"
  started || return 0
  expect '^seen tile_sum v0' "tile_sum's first frame"
  more_frames 3
  save "$here/dynsmem64k/tile.cu" tile.cu "$(version 1)"
  expect '^seen tile_sum v1' "tile_sum (64 KB of dynamic shared memory) running the edit (v1)"
  save "$here/dynsmem64k/tile.cu" tile.cu "$(version 2)"
  expect '^seen tile_sum v2' "tile_sum running the second edit (v2)"
  more_frames 3
  finish "tile_sum:0 1 2"
}

case_registers() {
  prepare registers "$1"
  cp "$here/registers/lighting.cu" "$dir/watch/lighting.cu"
  start "$1" "$bin/registers-$1"
  started || return 0
  expect '^seen shade v0' "shade's first frame"
  save "$here/registers/lighting.cu" lighting.cu "$(version 1)" 's/^#define DETAILED  *0$/#define DETAILED 1/'
  expect_in "$err" 'refused lighting .*(shade.*1024|1024.*shade)' \
    "hotkern's refusal of the edit needing 128 registers (naming shade and its 1024-thread blocks)"
  more_frames 3
  save "$here/registers/lighting.cu" lighting.cu "$(version 2)"
  expect '^seen shade v2' "shade running the next edit, which fits (v2)"
  more_frames 3
  finish "shade:0 2"
}

case_template_late() {
  prepare template_late "$1"
  cp "$here/template_late/blur.cu" "$dir/watch/blur.cu"
  start "$1" "$bin/template_late-$1"
  started || return 0
  expect '^seen blur1 v0' "blur<1>'s first frame"
  save "$here/template_late/blur.cu" blur.cu "$(version 1)"
  expect '^seen blur1 v1' "blur<1> running the edit (v1)"
  [ -z "$why" ] && : >"$dir/ctl/wide"
  expect '^wide blur on' "the program turning blur<3> on"
  expect '^seen blur3 v1' "blur<3>, first launched after the edit committed, running it (v1) with no other save"
  more_frames 3
  finish "blur1:0 1" "blur3:0 1"
}

case_cooperative() {
  prepare cooperative "$1"
  cp "$here/cooperative/norm.cu" "$dir/watch/norm.cu"
  start "$1" "$bin/cooperative-$1"
  started || return 0
  expect '^seen totals\.coop v0' "the cooperative launch's first frame"
  expect '^seen totals\.plain v0' "the <<<>>> launch's first frame"
  for v in 1 2; do
    save "$here/cooperative/norm.cu" norm.cu "$(version $v)"
    expect "^seen totals\\.plain v$v" "<<<>>> of totals running edit v$v"
    expect "^seen totals\\.coop v$v" "cudaLaunchCooperativeKernel of totals running edit v$v"
  done
  more_frames 3
  finish "totals.coop:0 1 2" "totals.plain:0 1 2"
}

case_graph() {
  prepare graph "$1"
  cp "$here/graph/sim.cu" "$dir/watch/sim.cu"
  start "$1" "$bin/graph-$1"
  started || return 0
  expect '^seen graph\.stamp v0' "the graph's first frame"
  for v in 1 2; do
    save "$here/graph/sim.cu" sim.cu "$(version $v)"
    expect "^seen direct\\.stamp v$v" "stamp's direct launch running edit v$v"
    more_frames 5 # the graph is captured again every 200 frames
  done
  finish "graph.stamp:0 1 2" "graph.mix:0 1 2" "direct.stamp:0 1 2"
}

case_threads() {
  prepare threads "$1"
  cp "$here/threads/work.cu" "$dir/watch/work.cu"
  start "$1" "$bin/threads-$1"
  started || return 0
  expect '^seen lane0\.tag v0' "thread 0's first batch"
  expect '^seen lane1\.tag v0' "thread 1's first batch"
  for v in 1 2 3; do
    save "$here/threads/work.cu" work.cu "$(version $v)"
    expect "^seen lane0\\.tag v$v" "thread 0's launches running edit v$v"
    expect "^seen lane1\\.tag v$v" "thread 1's launches running edit v$v"
  done
  more_frames 1
  finish "lane0.tag:0 1 2 3" "lane1.tag:0 1 2 3"
}

case_plugins() {
  [ "$1" = shared ] || return 0 # see the top of this file
  prepare plugins "$1"
  cp "$here/plugins/plug_a.cu" "$dir/watch/plug_a.cu"
  start "$1" "$bin/plugins-$1"
  started || return 0
  expect '^seen plug_a\.apply v0' "plugin A's first frame"
  save "$here/plugins/plug_a.cu" plug_a.cu "$(version 1)"
  expect '^seen plug_a\.apply v1' "plugin A running the edit of plug_a.cu (v1)"
  if [ -z "$why" ]; then echo plug_b >"$dir/ctl/plugin.new" && mv "$dir/ctl/plugin.new" "$dir/ctl/plugin"; fi
  expect '^seen plug_b\.apply v' "plugin B's first frame, after A's dlclose"
  more_frames 3
  if [ -z "$why" ]; then echo plug_a >"$dir/ctl/plugin.new" && mv "$dir/ctl/plugin.new" "$dir/ctl/plugin"; fi
  expect '^loaded plug_a' "plugin A loaded again" "$WAIT" 2
  expect '^seen plug_a\.apply v' "plugin A's first frame after its second dlopen" "$WAIT" 3
  more_frames 3
  finish "plug_a.apply:0 1" "plug_b.apply:0"
}

case_exit_mid_build() {
  r=1 bad=0 hung=0 first=
  kill_after=30 # a run takes a few seconds: one that hangs at exit is killed
  while [ $r -le "$EXIT_RUNS" ] && [ $hung -lt 3 ]; do
    prepare exit_mid_build "$1"
    cp "$here/exit_mid_build/quick.cu" "$dir/watch/quick.cu"
    mode='return'
    [ $((r % 2)) -eq 0 ] && mode='exit'
    case $((r % 6)) in
      0) delay=0 ;; 1) delay=0.01 ;; 2) delay=0.03 ;; 3) delay=0.06 ;; 4) delay=0.1 ;; *) delay=0.2 ;;
    esac
    start "$1" "$bin/exit_mid_build-$1" "$mode"
    started || return 0
    expect '^seen scale v0' "the first frame"
    save "$here/exit_mid_build/quick.cu" quick.cu "$(version $((r % 90 + 1)))"
    [ -z "$why" ] && sleep "$delay"
    : >"$dir/ctl/stop"
    wait "$pid"
    rc=$?
    last=$(tail -n 1 "$out")
    if [ -z "$why" ]; then
      if [ $rc -eq 137 ]; then
        why="killed: not ended $kill_after s after its start"
        hung=$((hung + 1))
      elif [ $rc -ne 0 ]; then
        why="exit status $rc"
      elif ! echo "$last" | grep -q '^done '; then
        why="its last line is '$last', not 'done ...'"
      fi
    fi
    if [ -n "$why" ]; then
      bad=$((bad + 1))
      if [ -z "$first" ]; then
        first="run $r ($mode $delay s after a save): $why"
        cp -r "$dir" "$dir.first-failure"
      fi
    fi
    r=$((r + 1))
  done
  kill_after=
  label=exit_mid_build.$1
  if [ $bad -eq 0 ]; then
    pass "$label"
  else
    out=$dir.first-failure/out.log err=$dir.first-failure/err.log
    [ $hung -ge 3 ] && first="$first (stopped after 3 runs that hung)"
    fail "$label" "$bad of $((r - 1)) runs went wrong; the first: $first"
  fi
}

# ---- main --------------------------------------------------------------------

for c in two_files dynsmem64k registers template_late cooperative graph threads plugins exit_mid_build; do
  [ "$only" = "  " ] || case $only in *" $c "*) ;; *) continue ;; esac
  for way in shared static; do
    [ "$c" = plugins ] && [ "$way" = static ] && continue
    exe=$bin/$c-$way
    if [ ! -x "$exe" ] || { [ "$way" = shared ] && [ ! -f "$preload" ]; }; then
      out=
      fail "$c.$way" "$exe or $preload is not built (make build)"
      continue
    fi
    "case_$c" "$way"
  done
done

echo "$passed passed, $failed failed, $skipped skipped"
if [ $keep -eq 1 ]; then
  echo "logs: $logs"
else
  rm -rf "$logs"
fi
[ $failed -eq 0 ]
