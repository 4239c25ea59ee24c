#!/usr/bin/env bash
# Runs every test: installs what is missing (Debian packages, the test virtualenv, the default
# model), builds Pagoda four times at most -- CPU-only release with -Werror, CPU-only
# AddressSanitizer + UBSan, the portable build (no AVX2: the scalar kernels, for CPUs without it)
# and the CUDA build where nvcc is found -- runs the C unit tests under each, then the integration
# tests (pytest) against the release build, and the --load-format dummy / --device ones against
# the CUDA build too.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc 2>/dev/null || echo 2)

bash scripts/install-deps.sh
venv=$(bash scripts/setup-venv.sh)
bash scripts/fetch-default-model.sh

# PAGODA_CUDA defaults to ON where nvcc is found: the CPU-only builds say OFF explicitly.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DPAGODA_CUDA=OFF -DPAGODA_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPAGODA_SANITIZE=ON \
    -DPAGODA_CUDA=OFF -DPAGODA_WERROR=ON -DCMAKE_C_COMPILER=clang >/dev/null
cmake --build build-asan -j"$jobs"
cmake -S . -B build-portable -DCMAKE_BUILD_TYPE=Release -DPAGODA_PORTABLE=ON -DPAGODA_CUDA=OFF \
    -DPAGODA_WERROR=ON >/dev/null
cmake --build build-portable -j"$jobs"

# The CUDA build (issue 7): compiles and links wherever nvcc is found, GPU or not; its CPU tests
# run below (without a GPU the CUDA backend reports "no CUDA device" and the CPU one is used).
have_cuda=0
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
    have_cuda=1
    cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DPAGODA_CUDA=ON -DPAGODA_WERROR=ON \
        -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" >/dev/null
    cmake --build build-cuda -j"$jobs"
fi

echo "== C unit tests (release)"
ctest --test-dir build --output-on-failure
echo "== C unit tests (AddressSanitizer + UndefinedBehaviorSanitizer)"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build-asan --output-on-failure

echo "== C unit tests (portable build: scalar kernels)"
ctest --test-dir build-portable --output-on-failure

if [ "$have_cuda" = 1 ]; then
    echo "== C unit tests (CUDA build, CPU backend)"
    ctest --test-dir build-cuda --output-on-failure
fi

echo "== integration tests"
PAGODA_BUILD="$root/build" PAGODA_ASAN_BUILD="$root/build-asan" \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/integration "$@"

echo "== client compatibility tests (the newest openai, openai-agents, anthropic, langchain-openai, instructor, litellm)"
cvenv=$(bash scripts/setup-venv.sh tests/clients/requirements.txt)
PAGODA_BUILD="$root/build" "$cvenv/bin/python" -m pytest -q -p no:cacheprovider tests/clients

echo "== router tests (replicas behind sglang-router)"
rvenv=$(bash scripts/setup-venv.sh tests/routers/requirements.txt)
PAGODA_BUILD="$root/build" "$rvenv/bin/python" -m pytest -q -p no:cacheprovider tests/routers

if [ "$have_cuda" = 1 ]; then
    echo "== integration tests of the CUDA build (dummy weights, devices; CPU backend)"
    PAGODA_BUILD="$root/build-cuda" \
        "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/integration/test_dummy_load.py
fi
