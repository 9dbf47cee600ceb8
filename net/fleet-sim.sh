#!/bin/sh
# Fleet simulation: FLEET puller processes (`hotkern pull`, default 50) poll one
# nginx origin on 127.0.0.1 for a signed release; a second release is published
# midway. Prints what the origin saw: requests and 304s while nothing changed,
# the requests a rollout cost, and how long until every puller had the release.
#
# usage: net/fleet-sim.sh [BUILD]          (BUILD defaults to build)
# environment: FLEET=50 INTERVAL_MS=500 STEADY_S=3 HOTKERN=BUILD/bin/hotkern
#              NGINX=/usr/sbin/nginx
# Everything runs under a temporary directory that is removed at the end;
# every wait is bounded and every process started here is stopped on exit.
set -eu

BUILD=${1:-build}
FLEET=${FLEET:-50}
INTERVAL_MS=${INTERVAL_MS:-500}
STEADY_S=${STEADY_S:-3}
HOTKERN=${HOTKERN:-$BUILD/bin/hotkern}
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}

[ -x "$HOTKERN" ] || { echo "fleet-sim: $HOTKERN not built (make BUILD=$BUILD build)" >&2; exit 1; }
[ -x "$NGINX" ] || { echo "fleet-sim: nginx not found (apt-get install nginx-light)" >&2; exit 1; }
"$HOTKERN" pull --help >/dev/null 2>&1 ||
  { echo "fleet-sim: this hotkern has no 'pull' command" >&2; exit 1; }

tmp=$(mktemp -d /tmp/hotkern-fleet-XXXXXX)
nginx_pid=""
pids=""
cleanup() {
  for p in $pids; do kill "$p" 2>/dev/null || true; done
  [ -n "$nginx_pid" ] && kill "$nginx_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

# Waits (bounded: $1 tenths of a second) until the command in $2... succeeds.
wait_for() {
  n=$1
  shift
  while [ "$n" -gt 0 ]; do
    if "$@"; then return 0; fi
    sleep 0.1
    n=$((n - 1))
  done
  return 1
}

mkdir -p "$tmp/www/rel" "$tmp/keys"
"$HOTKERN" keygen --out "$tmp/keys" >/dev/null
printf '.version 8.0\n.target sm_90\n// release 1\n' >"$tmp/add.ptx"
"$HOTKERN" sign --key "$tmp/keys/hotkern.key" --module add --release 1 --expires-in 3600 \
  --out "$tmp/www/rel" "$tmp/add.ptx" >/dev/null

# Start nginx on the first free port from a pseudo-random base.
port=$((20000 + $$ % 20000))
for attempt in 1 2 3 4 5; do
  cat >"$tmp/nginx.conf" <<EOF
$( [ "$(id -u)" = 0 ] && echo "user root root;" )
worker_processes 1;
error_log $tmp/error.log;
events { worker_connections 1024; }
http {
  access_log $tmp/access.log;
  client_body_temp_path $tmp/body;
  proxy_temp_path $tmp/proxy;
  fastcgi_temp_path $tmp/fastcgi;
  uwsgi_temp_path $tmp/uwsgi;
  scgi_temp_path $tmp/scgi;
  default_type application/octet-stream;
  etag on;
  server {
    listen 127.0.0.1:$port;
    root $tmp/www;
  }
}
EOF
  "$NGINX" -p "$tmp" -c "$tmp/nginx.conf" -g "daemon off; pid $tmp/nginx.pid;" 2>/dev/null &
  nginx_pid=$!
  if wait_for 50 curl -sf -o /dev/null "http://127.0.0.1:$port/rel/manifest.json"; then
    break
  fi
  kill "$nginx_pid" 2>/dev/null || true
  nginx_pid=""
  port=$((port + 1))
done
[ -n "$nginx_pid" ] || { echo "fleet-sim: nginx did not start" >&2; exit 1; }
url="http://127.0.0.1:$port/rel/manifest.json"
echo "origin: $url, fleet of $FLEET pullers polling every ${INTERVAL_MS} ms (+-10%)"

# Enough polls to outlast the run; `timeout` bounds each process regardless.
polls=$(((STEADY_S * 2 + 60) * 1000 / INTERVAL_MS))
i=1
while [ "$i" -le "$FLEET" ]; do
  mkdir -p "$tmp/p$i"
  timeout 300 "$HOTKERN" pull "$url" --pubkey "$tmp/keys/hotkern.pub" --state "$tmp/p$i/state" \
    --out "$tmp/p$i/out" --count "$polls" --interval-ms "$INTERVAL_MS" --timeout-ms 5000 \
    --quiet >"$tmp/p$i/log" 2>&1 &
  pids="$pids $!"
  i=$((i + 1))
done

# How many pullers have applied release $1.
have() { grep -l "applied add v$1:" "$tmp"/p*/log 2>/dev/null | wc -l; }
all_have() { [ "$(have "$1")" -eq "$FLEET" ]; }
lines() { wc -l <"$tmp/access.log"; }
# Requests and 304s in access log lines $1+1 .. $2.
window() {
  sed -n "$(($1 + 1)),$2p" "$tmp/access.log" >"$tmp/window"
  echo "$(wc -l <"$tmp/window") requests, $(grep -c '" 304 ' "$tmp/window" || true) of them 304"
}

wait_for 300 all_have 1 || { echo "fleet-sim: only $(have 1)/$FLEET pullers got release 1" >&2; exit 1; }
echo "release 1: on all $FLEET pullers"

a=$(lines)
sleep "$STEADY_S"
b=$(lines)
echo "steady, ${STEADY_S}s with nothing new: $(window "$a" "$b")"

printf '.version 8.0\n.target sm_90\n// release 2, a little longer\n' >"$tmp/add.ptx"
start=$(date +%s.%N)
"$HOTKERN" sign --key "$tmp/keys/hotkern.key" --module add --release 2 --expires-in 3600 \
  --out "$tmp/www/rel" "$tmp/add.ptx" >/dev/null
wait_for 300 all_have 2 || { echo "fleet-sim: only $(have 2)/$FLEET pullers got release 2" >&2; exit 1; }
end=$(date +%s.%N)
c=$(lines)
echo "release 2: on all $FLEET pullers $(echo "$end - $start" | bc 2>/dev/null || echo "?") s after publishing"
echo "rollout: $(window "$b" "$c")"

sleep "$STEADY_S"
d=$(lines)
echo "steady again, ${STEADY_S}s: $(window "$c" "$d")"

bad=0
i=1
while [ "$i" -le "$FLEET" ]; do
  cmp -s "$tmp/add.ptx" "$tmp/p$i/out/add.ptx" || bad=$((bad + 1))
  i=$((i + 1))
done
echo "pullers whose saved artifact differs from release 2: $bad"
echo "origin total: $(lines) requests, $(grep -c '" 304 ' "$tmp/access.log" || true) of them 304"
[ "$bad" -eq 0 ]
