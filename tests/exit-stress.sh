#!/bin/sh
# Exits in the middle of hotkern's first build, on a GPU: RUNS short runs of
# an ordinary nvcc program under the preload library (BUILD/stub/
# exit_app_shared, LD_PRELOAD) and RUNS of its --wrap build (exit_app_static),
# each with HOTKERN_WATCH on a CUDA C file with its kernel and KERNELS more
# (no compile cache: every run builds it), each ending at a random moment of
# that first build: returning from main, calling exit, or calling exit from a
# second thread while the main thread launches (tests/stub/exit_app.cu). Every
# run must end with the program's status (7) and its output whole; crashes,
# other statuses and lost output are counted and the script fails on any.
# It first measures how long the first build takes (a run that waits for
# the commit), and draws the moments of exit from 0 to that (+300 ms).
#
#   usage: sh tests/exit-stress.sh [BUILD]   (make build first; GPU machine)
#   environment: RUNS (1000 per build), JOBS (8 at once), KERNELS (40),
#                SEED (1), APPS ("shared static": which builds), HOWS
#                ("return exit thread": the ways of ending, in turn), OFF
#                (1: HOTKERN_OFF=1, the program without hotkern, to compare)
# A run that has not ended 60 s after it began is killed and counted hung.
# Prints one line per build and "exit-stress: PASS" or "exit-stress: FAIL".
set -u
BUILD=${1:-build}
BUILD=$(cd "$BUILD" && pwd) || exit 1
RUNS=${RUNS:-1000}
JOBS=${JOBS:-8}
KERNELS=${KERNELS:-40}
SEED=${SEED:-1}
APPS=${APPS:-shared static}
HOWS=${HOWS:-return exit thread}
OFF=${OFF:-}
for f in stub/exit_app_shared stub/exit_app_static lib/libhotkern-preload.so bin/hotkern-build; do
    [ -x "$BUILD/$f" ] || [ -f "$BUILD/$f" ] || { echo "exit-stress: $BUILD/$f is missing: make build" >&2; exit 1; }
done
TMP=$(mktemp -d "${TMPDIR:-/tmp}/hotkern-exit-stress.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/w"
# The watched module: the program's kernel fill, and KERNELS that take NVRTC
# a while.
{
    echo '#define BODY(i) for (int k = 0; k < 64; k++) acc = acc * 1.0001f + __sinf(acc + k * (i));'
    echo 'extern "C" __global__ void fill(float *x) { if (x) *x = 2.0f; }'
    i=0
    while [ "$i" -lt "$KERNELS" ]; do
        echo "extern \"C\" __global__ void k$i(float *x) { float acc = x[threadIdx.x];"
        echo "#pragma unroll"
        echo " BODY($i) x[threadIdx.x] = acc; }"
        i=$((i + 1))
    done
} >"$TMP/w/big.cu"

# One run: app (shared|static) how delay_us dir. Leaves rc, out, err in dir.
cat >"$TMP/run1.sh" <<'EOF'
app=$1 how=$2 delay=$3 d=$4
mkdir -p "$d"
cd "$d" || exit 1
if [ "$app" = shared ]; then pre="$BUILD/lib/libhotkern-preload.so"; else pre=; fi
env HOTKERN_WATCH="$TMP/w" HOTKERN_CACHE_DIR= HOTKERN_LOG=info LD_PRELOAD="$pre" \
    ${OFF:+HOTKERN_OFF=1} timeout -s KILL 60 "$BUILD/stub/exit_app_$app" "$delay" "$how" >out 2>err
echo $? >rc
EOF
export BUILD TMP OFF

# How long the first build takes: a run that lasts until it has committed.
T=0
[ -n "$OFF" ] && T=${SPAN_MS:-3000} # nothing builds: the span the caller gives
for app in $APPS; do
    [ -n "$OFF" ] && break
    sh "$TMP/run1.sh" "$app" return 20000000 "$TMP/measure-$app" &
    pid=$!
    n=0
    while ! grep -q 'big v1 (was none)' "$TMP/measure-$app/err" 2>/dev/null && [ $n -lt 600 ]; do
        sleep 0.1
        n=$((n + 1))
    done
    pkill -P "$pid" 2>/dev/null # the program; its shell then ends
    wait "$pid" 2>/dev/null
    ms=$(awk '/big v1 \(was none\)/ { for (i = 1; i <= NF; i++) if ($i == "in") { print int($(i + 1)); exit } }' \
        "$TMP/measure-$app/err")
    if [ -z "$ms" ]; then
        echo "exit-stress: the $app build's first version never committed within 60 s:" >&2
        cat "$TMP/measure-$app/err" >&2
        exit 1
    fi
    echo "exit-stress: $app: the first build commits $ms ms after its submission"
    [ "$ms" -gt "$T" ] && T=$ms
done
# Submission comes after the runtime is made (CUDA and the build helper
# start): 300 ms more. Under JOBS at once builds take longer: most runs end
# during theirs, some after (a hot version running as the program exits).
SPAN_US=$(( (T + 300) * 1000 ))

fail=0
for app in $APPS; do
    awk -v n="$RUNS" -v seed="$SEED" -v span="$SPAN_US" -v app="$app" -v tmp="$TMP" \
        -v hows="$HOWS" 'BEGIN {
        srand(seed); k = split(hows, how, " ");
        for (i = 0; i < n; i++)
            printf "%s %s %d %s/%s-%d\n", app, how[i % k + 1], int(rand() * span), tmp, app, i
    }' >"$TMP/plan-$app"
    xargs -P "$JOBS" -L 1 sh "$TMP/run1.sh" <"$TMP/plan-$app"
    crashed=0 status=0 lost=0 during=0 hung=0
    i=0
    while [ "$i" -lt "$RUNS" ]; do
        d="$TMP/$app-$i"
        rc=$(cat "$d/rc" 2>/dev/null || echo none)
        if [ "$rc" != 7 ]; then
            case "$rc" in
            137) hung=$((hung + 1)) ;;
            1[3-9][0-9] | 2[0-5][0-9]) crashed=$((crashed + 1)) ;;
            *) status=$((status + 1)) ;;
            esac
            [ $((crashed + status + hung)) -le 5 ] &&
                { echo "== $app run $i ($(sed -n "$((i + 1))p" "$TMP/plan-$app" | cut -d' ' -f2,3)): status $rc"; tail -12 "$d/err"; }
        fi
        if ! printf 'exit_app started\nexit_app done\n' | cmp -s - "$d/out"; then
            lost=$((lost + 1))
        fi
        grep -q 'big v1 (was none)' "$d/err" || during=$((during + 1))
        i=$((i + 1))
    done
    echo "exit-stress: $app${OFF:+ (HOTKERN_OFF=1)}: $RUNS runs ($HOWS), $during of them ended" \
        "before the first version committed: $crashed crashed, $hung hung, $status other" \
        "statuses, $lost with lost output"
    [ $((crashed + status + lost + hung)) -eq 0 ] || fail=1
    rm -rf "$TMP/$app"-*
done
if [ "$fail" = 0 ]; then echo "exit-stress: PASS"; else echo "exit-stress: FAIL"; exit 1; fi
