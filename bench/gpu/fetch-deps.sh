#!/usr/bin/env bash
# Fetches the Debian packages bench/gpu/check.sh unpacks on a GPU machine that has no libcjson
# (and, for the pagoda command, no libuv or libmicrohttpd) and no network. libcjson and libuv
# need only libc; libmicrohttpd needs libgnutls.so.30 at run time, which Ubuntu images carry.
# Run on a Debian/Ubuntu machine with apt; writes bench/gpu/deps/*.deb (git-ignored), which travels with the check.
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p deps
cd deps
apt-get download libcjson1 libcjson-dev libuv1 libuv1-dev libmicrohttpd12 libmicrohttpd-dev
ls -l ./*.deb
