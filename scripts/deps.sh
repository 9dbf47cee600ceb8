#!/bin/sh
# Installs the Debian packages hotkern builds and tests with, when they are missing.
# Safe to run again: it only calls apt-get when pkg-config or PATH lacks something.
# The CUDA 13 toolkit itself is not a Debian package: it is expected at $CUDA
# (default /usr/local/cuda), and its absence is reported, not installed.
set -eu
CUDA=${CUDA:-/usr/local/cuda}
missing=""
need_pc() { pkg-config --exists "$1" 2>/dev/null || missing="$missing $2"; }
command -v pkg-config >/dev/null 2>&1 || missing="$missing pkg-config"
need_pc check check
need_pc libcurl libcurl4-openssl-dev
need_pc libmicrohttpd libmicrohttpd-dev
need_pc libsodium libsodium-dev
need_pc libcjson libcjson-dev
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing="$missing nginx-light"
command -v curl >/dev/null 2>&1 || missing="$missing curl"
# prometheus: tests/cpu_prometheus.c scrapes the metrics with a real server (not started as a service).
[ -x /usr/bin/prometheus ] || missing="$missing prometheus"
command -v cmake >/dev/null 2>&1 || missing="$missing cmake"
command -v clang-format >/dev/null 2>&1 || missing="$missing clang-format"
# groff: make lint renders the man pages; man: tests/cpu_install.c reads the installed ones.
command -v groff >/dev/null 2>&1 || missing="$missing groff-base"
command -v man >/dev/null 2>&1 || missing="$missing man-db"
# python3: make lint's layering check (scripts/layers.py).
command -v python3 >/dev/null 2>&1 || missing="$missing python3"
# libabigail: make abi-check compares the shared libraries with abi/*.abi.
{ command -v abidw && command -v abidiff; } >/dev/null 2>&1 || missing="$missing abigail-tools"
command -v cc >/dev/null 2>&1 || missing="$missing build-essential"
# g++: the C++ suites and example of the typed-launch header (hotkern.hpp).
command -v g++ >/dev/null 2>&1 || missing="$missing g++"
if [ -n "$missing" ]; then
  echo "deps: installing:$missing"
  if [ "$(id -u)" != 0 ] && ! command -v sudo >/dev/null 2>&1; then
    echo "deps: need root (or sudo) to apt-get install:$missing" >&2
    exit 1
  fi
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq || { echo "deps: apt-get update failed; install by hand:$missing" >&2; exit 1; }
  # shellcheck disable=SC2086
  $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null ||
    { echo "deps: apt-get install failed; install by hand:$missing" >&2; exit 1; }
  # Debian starts the package's service where systemd runs; the tests start
  # their own server, so the one this install started is stopped again.
  case " $missing " in *" prometheus "*)
    if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
      $SUDO systemctl disable --now prometheus >/dev/null 2>&1 &&
        echo "deps: stopped and disabled the prometheus service the install started (tests run their own)"
    fi ;;
  esac
fi
if [ ! -f "$CUDA/include/cuda.h" ] || [ ! -f "$CUDA/include/nvrtc.h" ]; then
  echo "deps: the CUDA toolkit (13.x) was not found at $CUDA; set CUDA=/path/to/cuda" >&2
  exit 1
fi
