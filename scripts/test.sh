#!/usr/bin/env bash
# Runs every test: installs what is missing (Debian packages, the test virtualenv, the default
# model), builds Pagoda twice (release with -Werror, and AddressSanitizer + UBSan), runs the C
# unit tests under both builds, then the integration tests (pytest) against the release build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc 2>/dev/null || echo 2)

bash scripts/install-deps.sh
venv=$(bash scripts/setup-venv.sh)
bash scripts/fetch-default-model.sh

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DPAGODA_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPAGODA_SANITIZE=ON \
    -DPAGODA_WERROR=ON -DCMAKE_C_COMPILER=clang >/dev/null
cmake --build build-asan -j"$jobs"

echo "== C unit tests (release)"
ctest --test-dir build --output-on-failure
echo "== C unit tests (AddressSanitizer + UndefinedBehaviorSanitizer)"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build-asan --output-on-failure

echo "== integration tests"
PAGODA_BUILD="$root/build" PAGODA_ASAN_BUILD="$root/build-asan" \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/integration "$@"
