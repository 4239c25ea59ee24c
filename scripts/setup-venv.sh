#!/usr/bin/env bash
# Creates (or reuses) a Python virtualenv in a cache folder outside the checkout, keyed by the
# hash of a requirements file (default tests/requirements.txt; bench/requirements.txt for the
# benchmarks). Prints the venv path on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
req="${1:-$root/tests/requirements.txt}"
cache="${PAGODA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pagoda}"
hash=$(sha256sum "$req" | cut -c1-16)
venv="$cache/venv-$hash"
if [ ! -f "$venv/.complete" ]; then
    rm -rf "$venv"
    mkdir -p "$cache"
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install -q --upgrade pip >&2
    "$venv/bin/pip" install -q -r "$req" >&2
    touch "$venv/.complete"
fi
echo "$venv"
