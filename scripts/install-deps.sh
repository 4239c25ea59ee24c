#!/usr/bin/env bash
# Installs the Debian packages Pagoda needs to build and test (idempotent; skips when present).
set -euo pipefail
pkgs=(build-essential cmake pkg-config libcjson-dev libuv1-dev libmicrohttpd-dev libsystemd-dev clang
      libzmq3-dev libmsgpack-dev python3-venv curl haproxy)
missing=()
for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi
