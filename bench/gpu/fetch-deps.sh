#!/usr/bin/env bash
# Fetches the Debian packages bench/gpu/check.sh unpacks on a GPU machine that has no libcjson
# and no network (libcjson1 and libcjson-dev; they need only libc). Run on a Debian/Ubuntu
# machine with apt; writes bench/gpu/deps/*.deb (git-ignored), which travels with the check.
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p deps
cd deps
apt-get download libcjson1 libcjson-dev
ls -l ./*.deb
