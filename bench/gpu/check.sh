#!/usr/bin/env bash
# The GPU check (issue 7), one script, <= 8 minutes on a fresh H100/H200 with the CUDA toolkit,
# PyTorch and transformers: build with CUDA, op-by-op CUDA vs CPU (test_backend_ops), greedy
# generation CUDA vs CPU (tiny models, SmolLM2-135M), then a Llama-3-8B-shaped dummy model in BF16:
# decode tok/s at batch 1/8/64/256 with 512-token contexts, prefill tok/s at 2,048 tokens, HBM
# bandwidth (copy kernel), batch-1 decode as a fraction of the roofline, and transformers
# generate on the same shapes as a baseline (the three targets' figures PGD_REPS = 3 times, their
# medians summarized). Writes one results file: $OUT or bench/gpu/results.txt. Run on an H200 on
# 2026-11-29 and -30 (bench/RESULTS.md); bench/gpu/diag.sh profiles a decode step after it.
#
# Needs only the CUDA toolkit (nvcc, cuBLAS), NCCL (the toolkit's, the system's, or PyTorch's
# nvidia-nccl wheel), CMake, a C compiler and libcjson; the `pagoda` command is built too where
# libuv and libmicrohttpd are found (fetch-deps.sh fetches them as well). Where libcjson is
# missing and nothing can be installed (a GPU image with no network), run bench/gpu/fetch-deps.sh
# on a machine with apt first:
# it puts the Debian packages in bench/gpu/deps/, which this script unpacks under /tmp (carry
# bench/gpu/deps and models/ to such a machine).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
res=${OUT:-$root/bench/gpu}/results.txt
mkdir -p "$(dirname "$res")"
: >"$res"
log() { echo "[$(date +%T)] $*" | tee -a "$res" >&2; }
step() { # name timeout_s cmd...: runs, logs output, never aborts the script
    local name=$1 t=$2; shift 2
    log "== $name"
    if timeout "$t" "$@" >>"$res" 2>&1; then log "   $name: ok"
    else log "   $name: FAILED ($?)"; fi
}
log "host: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)"
py=${PYTHON:-python3}
# gpu_bench tags each figure with every PAGODA_* variable set: exported ones tag all of them, and
# summarize.py then takes its medians from the most common variant instead of the defaults.
# (grep finding nothing exits 1: || true, or set -e and pipefail would end the script here.)
pagoda_env=$(env | grep '^PAGODA_' | tr '\n' ' ' || true)
if [ -n "$pagoda_env" ]; then
    log "WARNING: PAGODA_* set in the environment, every figure below runs with it: $pagoda_env"
else
    log "environment: no PAGODA_* variable set"
fi

# What this machine has, for a run that fails before it measures anything.
{
    echo "-- environment"
    command -v nvcc cmake cc pkg-config "$py" 2>&1 || true
    nvcc --version 2>&1 | tail -1 || true
    ls -d /usr/local/cuda*/lib64 2>&1 | head -3
    timeout 30 find / -xdev \( -name 'libcublasLt.so*' -o -name 'libnccl.so*' -o -name nccl.h \
        -o -name cJSON.h \) 2>/dev/null | grep -v "^/proc" | head -12
} >>"$res" 2>&1 || true

# libcjson, and for the pagoda command libuv and libmicrohttpd: the system's, else the Debian
# packages bench/gpu/fetch-deps.sh put in bench/gpu/deps (unpacked under /tmp/pgd-deps: nothing
# is installed; PGD_FORCE_DEPS=1 uses them even where the system has its own), else apt-get.
cmake_extra=()
have() { pkg-config --exists "$1" 2>/dev/null; }
if ls bench/gpu/deps/*.deb >/dev/null 2>&1 &&
   { [ -n "${PGD_FORCE_DEPS:-}" ] ||
     ! { have libcjson && have libuv && have libmicrohttpd; }; }; then
    rm -rf /tmp/pgd-deps
    for d in bench/gpu/deps/*.deb; do dpkg-deb -x "$d" /tmp/pgd-deps || log "cannot unpack $d"; done
    # the .pc files name /usr: point them at the unpacked tree; drop Requires.private
    # (libmicrohttpd's gnutls: needed only to link statically, its .pc absent on a bare image)
    sed -i -e 's|=/usr|=/tmp/pgd-deps/usr|' -e '/^Requires.private:/d' \
        /tmp/pgd-deps/usr/lib/*/pkgconfig/*.pc || true
    pcdir=/tmp/pgd-deps/usr/lib/x86_64-linux-gnu/pkgconfig
    export PKG_CONFIG_PATH=$pcdir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    cmake_extra+=("-DCMAKE_PREFIX_PATH=/tmp/pgd-deps/usr")
    libdir=/tmp/pgd-deps/usr/lib/x86_64-linux-gnu
    export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    log "unpacked bench/gpu/deps: $(cd bench/gpu/deps && echo *.deb)"
fi
if ! { [ -f /usr/include/cjson/cJSON.h ] || have libcjson; } && command -v apt-get >/dev/null; then
    timeout 120 apt-get install -y libcjson-dev >>"$res" 2>&1 ||
        log "apt-get install libcjson-dev failed"
fi
server=OFF
have libuv && have libmicrohttpd && server=ON
log "the pagoda command (libuv, libmicrohttpd): $server"
# NCCL: the toolkit's or the system's, else PyTorch's nvidia-nccl wheel (libnccl.so.2 + nccl.h,
# wherever the wheel's layout puts them under site-packages/nvidia).
if ! compgen -G "/usr/local/cuda*/lib64/libnccl.so*" >/dev/null &&
   ! compgen -G "/usr/lib/x86_64-linux-gnu/libnccl.so*" >/dev/null; then
    sp=$($py -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" 2>/dev/null || true)
    lib=$(find "$sp/nvidia" -name 'libnccl.so*' 2>/dev/null | sort | head -1 || true)
    inc=$(find "$sp/nvidia" -name nccl.h 2>/dev/null | head -1 || true)
    if [ -n "$lib" ] && [ -n "$inc" ]; then
        cmake_extra+=("-DPGD_NCCL_LIBRARY=$lib" "-DPGD_NCCL_INCLUDE=$(dirname "$inc")")
        export LD_LIBRARY_PATH=$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        log "NCCL: $lib, $inc"
    else
        log "NCCL: not found under ${sp:-?}/nvidia"
    fi
fi

cfg_args="-DPAGODA_CUDA=ON -DPAGODA_SERVER=$server -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90 ${cmake_extra[*]}"
targets="test_backend_ops test_device_sample test_tp gpu_bench"
[ "$server" = ON ] && targets="$targets pagoda"
step "configure+build (CUDA, sm_90)" 240 bash -c \
    "rm -rf build-gpucheck && cmake -S . -B build-gpucheck $cfg_args >/dev/null &&
     cmake --build build-gpucheck -j\$(nproc) --target $targets >/dev/null"
log "$(nvidia-smi --query-gpu=driver_version,clocks.max.sm,clocks.max.mem --format=csv 2>&1 |
       tr '\n' ' ')"
step "op-by-op CUDA vs CPU (NMSE)" 90 env PAGODA_REQUIRE_CUDA=1 ./build-gpucheck/test_backend_ops
# the sampling kernel (temperature, top-k/top-p/min-p) against the CPU chain's kept sets and draws
n_before=$(wc -l <"$res")
step "sampling on the GPU vs the CPU chain (test_device_sample)" 120 \
    ./build-gpucheck/test_device_sample
# test_device_sample tests the CUDA op only where it finds a device (it ignores
# PAGODA_REQUIRE_CUDA), and passes on the CPU's alone: its "cuda op: " lines say it ran.
if ! awk -v n="$n_before" 'NR > n && /^cuda op: /{ f = 1 } END { exit !f }' "$res"; then
    log "   test_device_sample: FAILED (no \"cuda op:\" line: CUDA op NOT tested on the GPU)"
fi
if ! grep -q "all ops within thresholds" "$res" && command -v compute-sanitizer >/dev/null; then
    step "op-by-op under compute-sanitizer memcheck" 100 env PAGODA_REQUIRE_CUDA=1 \
        compute-sanitizer --tool memcheck --print-limit 20 ./build-gpucheck/test_backend_ops
fi
B=./build-gpucheck/gpu_bench
# SmolLM2-135M: the whole model where it is there, else its first 3 of 30 layers (real weights
# and shapes in a file small enough to travel: bench/gpu/truncate_gguf.py).
smol=models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$smol" ] || smol=models/SmolLM2-135M-Instruct.Q4_1.first3.gguf
# ids DEVICE MODEL N L [VAR=VALUE...]: the N greedy ids gpu_bench prints after an L-token prompt
# (the device field dropped, so that CPU and CUDA lines compare)
ids() {
    local dev=$1 m=$2 n=$3 l=$4
    shift 4
    timeout 60 env "$@" $B greedy "$m" "$dev" "$n" "$l" 2>>"$res" |
        sed "s/\"device\":\"$dev\",//" || true
}
# same WHAT CPU_IDS CUDA_IDS
same() {
    if [ -n "$2" ] && [ "$2" = "$3" ]; then log "greedy $1: CUDA == CPU ($2)"
    else log "greedy $1: DIFFER cpu=$2 cuda=$3"; fi
}
# bench/gpu/models/*.gguf (ignored by git; carry them): more models where they are there, as
# bench/gpu/make_models.py writes them (~50 MiB): kquant.gguf (every matrix Q4_K, Q5_K or Q6_K),
# quantmix.gguf (all 12 quantized types; both kept quantized on the GPU: kernels/qblocks.h), and
# the tiny random Qwen3 (QK-norm) and SmolLM3 (NoPE layers) of make_tiny_models.py.
for m in tests/data/models/stories260K.gguf tests/data/models/llama-2-tiny-random.gguf "$smol" \
    bench/gpu/models/*.gguf; do
    [ -f "$m" ] || { log "skip $m (missing)"; continue; }
    same "$m" "$(ids cpu "$m" 32 9)" "$(ids cuda "$m" 32 9)"
    # a 100-token prompt (tensor-core prefill attention) and decode with and without CUDA graphs,
    # with the grouped GEMVs (and the SiLU-gate folded into them) switched off, and without
    # programmatic dependent launch
    a=$(ids cpu "$m" 24 100)
    for env in "" PAGODA_CUDA_GRAPHS=0 PAGODA_CUDA_TC_ATTN=0 PAGODA_CUDA_GEMV_GROUP=0 \
        PAGODA_CUDA_PDL=0 "PAGODA_CUDA_PDL=0 PAGODA_CUDA_GRAPHS=0"; do
        same "$m, 100-token prompt ${env:-(graphs, TC attention)}" "$a" \
            "$(ids cuda "$m" 24 100 $env)"
    done
done
# Tensor parallel over NCCL where the machine has GPUs enough: TP=2 on the tiny models, TP=3 on
# SmolLM2 (9 heads, 3 KV heads), greedy ids against the CPU's (TP=1).
n_gpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
for spec in "2 tests/data/models/stories260K.gguf" "2 tests/data/models/llama-2-tiny-random.gguf" \
            "3 $smol"; do
    read -r tp m <<<"$spec"
    if [ "${n_gpu:-0}" -lt "$tp" ]; then
        log "tensor parallel $tp, $m: skipped (${n_gpu:-0} GPU)"
        continue
    fi
    same "$m, TP=$tp" "$(ids cpu "$m" 32 9)" "$(ids cuda "$m" 32 9 PAGODA_TENSOR_PARALLEL=$tp)"
done
cfg=configs/models/Llama-3-8B.json
# The product's own path on CUDA (the engine behind `pagoda generate` and `pagoda bench`, device
# sampling, graphs): stories260K's greedy text from BOS against llama2.c's, then the benchmark.
# (`pagoda` falls back to the CPU where it finds no CUDA device: then these steps are skipped.)
P=./build-gpucheck/pagoda
[ -x "$P" ] || P=
if [ -n "$P" ]; then
    exp=tests/data/models/stories260K.expected.txt
    timeout 60 $P generate -m tests/data/models/stories260K.gguf --device cuda -p "" -n 200 \
        --temperature 0 >/tmp/pgd-stories.txt 2>/tmp/pgd-stories.err || true
    cat /tmp/pgd-stories.err >>"$res"
    starts='import sys; a, b = (open(f).read() for f in sys.argv[1:]); sys.exit(a[:len(b)] != b)'
    if grep -q "using the CPU backend" /tmp/pgd-stories.err; then
        log "pagoda --device cuda found no CUDA device: its steps are skipped"
        P=
    elif $py -c "$starts" /tmp/pgd-stories.txt "$exp"; then
        log "pagoda generate --device cuda, stories260K: llama2.c's text"
    else
        log "pagoda generate --device cuda, stories260K: DIFFERS from llama2.c's text:"
        head -c 300 /tmp/pgd-stories.txt >>"$res"
    fi
    if [ -n "$P" ]; then
        # /v1/embeddings' path (the final hidden state downloaded with the logits): `pagoda batch`
        # input lines on CUDA against the CPU's vectors (unit-norm; 1e-2 is ~3x what the two
        # backends' different summation orders cost on SmolLM2's logits)
        printf '%s\n' '{"id": 1, "input": "The capital of France is Paris."}' \
            '{"id": 2, "input": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}' >/tmp/pgd-embed.jsonl
        for dev in cpu cuda; do
            timeout 120 $P batch -m "$smol" --device $dev --input /tmp/pgd-embed.jsonl \
                --output /tmp/pgd-embed.$dev.jsonl --no-progress 2>>"$res" || true
        done
        cmp_embed='import json, sys
a, b = ([json.loads(l)["embedding"] for l in open(f)] for f in sys.argv[1:])
d = max(abs(x - y) for u, v in zip(a, b) for x, y in zip(u, v))
print(f"{d:.2e}", "ok" if d < 1e-2 and len(a) == len(b) == 2 else "DIFFER")'
        log "embeddings CUDA vs CPU, max |diff|: $($py -c "$cmp_embed" /tmp/pgd-embed.cpu.jsonl \
            /tmp/pgd-embed.cuda.jsonl 2>&1 | tail -1)"
        step "pagoda bench --device cuda, $smol" 120 \
            $P bench -m "$smol" --device cuda -p 128 -n 64 -r 2 --batch 1,16,64 --json
    fi
fi
step "HBM bandwidth (copy kernel)" 30 $B bandwidth
step "cuBLASLt BF16 GEMM peak (8192^3)" 30 $B gemm
# the three targets' figures PGD_REPS times (3), interleaved; summarize.py takes the medians.
# Decode without programmatic dependent launch alternates with them (its A/B).
for rep in $(seq "${PGD_REPS:-3}"); do
    step "decode batch 1 ctx 512 (run $rep)" 60 $B decode "$cfg" 1 512 32
    step "decode batch 1 ctx 512, no PDL (run $rep)" 60 env PAGODA_CUDA_PDL=0 \
        $B decode "$cfg" 1 512 32
    step "prefill 2048 (run $rep)" 60 $B prefill "$cfg" 2048
    step "decode batch 64 ctx 512 (run $rep)" 60 $B decode "$cfg" 64 512 32
    step "decode batch 64 ctx 512, no PDL (run $rep)" 60 env PAGODA_CUDA_PDL=0 \
        $B decode "$cfg" 64 512 32
done
for bs in 8 256; do step "decode batch $bs ctx 512" 60 $B decode "$cfg" "$bs" 512 32; done
[ -n "${PGD_SKIP_HF:-}" ] ||
    step "transformers baseline (same shapes, BF16, random weights)" 180 \
        $py bench/gpu/hf_baseline.py "$cfg"
for bs in 1 64; do
    step "decode batch $bs ctx 512, no CUDA graphs" 60 \
        env PAGODA_CUDA_GRAPHS=0 $B decode "$cfg" "$bs" 512 32
done
step "prefill 2048, CUDA-core attention" 60 env PAGODA_CUDA_TC_ATTN=0 $B prefill "$cfg" 2048
if [ -n "$P" ]; then
    step "pagoda bench --device cuda, Llama-3-8B dummy BF16" 180 \
        $P bench --load-format dummy -m "$cfg" --device cuda -p 512 -n 64 -r 2 --batch 64 --json
    # the same shapes in llama.cpp's Q4_K_M types (4.88 GB a step), kept quantized on the GPU
    # (kernels/qblocks.h): the fraction of the HBM roofline the GEMV reaches with every lane
    # decoding its own block
    step "pagoda bench --device cuda, Llama-3-8B dummy Q4_K_M" 180 \
        env PAGODA_DUMMY_TYPE=Q4_K_M $P bench --load-format dummy -m "$cfg" --device cuda \
        -p 512 -n 64 -r 2 --batch 1,64 --json
fi
# the figures against the issue's targets (batch-1 decode / roofline, prefill / GEMM peak, batch
# 64 / transformers) and every batch size against transformers
$py bench/gpu/summarize.py "$res" >"$res.sum" 2>&1 || true
cat "$res.sum" >>"$res" && rm -f "$res.sum"
log "done: $res"
