#!/usr/bin/env bash
# Where a decode step's time goes on the GPU (run after bench/gpu/check.sh, which builds
# build-gpucheck): per-kernel durations and DRAM bytes from Nsight Compute for one decode step of
# the Llama-3-8B-shaped dummy model at batch 1, 8 and 64 (CUDA graphs off, so each kernel is
# seen) and for a 2,048-token prefill, and the decode benchmark without CUDA graphs and at more
# batch sizes. Writes $OUT/diag.txt and $OUT/ncu_*.csv (bench/gpu/ncu_summary.py tabulates them).
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-bench/gpu}
d=$out/diag.txt
: >"$d"
export LD_LIBRARY_PATH=/tmp/pgd-deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B=./build-gpucheck/gpu_bench
cfg=configs/models/Llama-3-8B.json
log() { echo "[$(date +%T)] $*" | tee -a "$d" >&2; }
# DIAG_DECODE ("SWITCH=VALUE BATCH;..."), DIAG_PREFILL (switches) and DIAG_NCU (batch sizes)
# choose a shorter run; X=0 is no switch.
IFS=';' read -ra decode <<<"${DIAG_DECODE:-PAGODA_CUDA_GRAPHS=0 8;PAGODA_CUDA_GRAPHS=0 256;X=0 2;\
X=0 4;X=0 16;X=0 32;X=0 128;PAGODA_CUDA_ATTN_FILL=0 1;PAGODA_CUDA_ATTN_FILL=0 64;\
PAGODA_CUDA_ATTN_FILL=2 1;PAGODA_CUDA_ATTN_FILL=8 1;PAGODA_CUDA_GEMV_GROUP=0 1}"
for v in "${decode[@]}"; do
    set -- $v
    log "decode batch $2, $1"
    timeout 60 env "$1" $B decode "$cfg" "$2" 512 32 >>"$d" 2>&1
done
# each GEMM converting its own activations, or sharing the one its producer wrote
for v in ${DIAG_PREFILL:-PAGODA_CUDA_XCONV=0 X=0}; do
    log "prefill 2048, $v"
    timeout 60 env "$v" $B prefill "$cfg" 2048 >>"$d" 2>&1
done
# One decode step's kernels: gpu_bench starts the profiler at the first timed step (after the
# context fill and two warm-up steps); 640 kernels are one to two steps.
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for bs in ${DIAG_NCU:-1 8 64}; do
    log "ncu decode batch $bs"
    timeout 100 env PAGODA_CUDA_GRAPHS=0 "$ncu" --clock-control none --csv --page raw \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        --profile-from-start off --launch-count 640 --log-file "$out/ncu_b$bs.csv" \
        $B decode "$cfg" "$bs" 512 12 >>"$d" 2>&1 || log "ncu batch $bs failed ($?)"
done
log "ncu prefill 2048"
timeout 100 "$ncu" --clock-control none --csv --page raw \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    --launch-count 640 --log-file "$out/ncu_prefill.csv" $B prefill "$cfg" 2048 >>"$d" 2>&1 ||
    log "ncu prefill failed ($?)"
# Why the decode attention kernel stalls at batch 64 (40% of that step at ~1 TB/s): warp stall
# reasons, occupancy and memory throughput of one launch (DIAG_ATTN= skips it).
if [ -z "${DIAG_ATTN+x}" ] || [ -n "$DIAG_ATTN" ]; then
    log "ncu decode attention, batch 64, details"
    timeout 100 env PAGODA_CUDA_GRAPHS=0 "$ncu" --clock-control none --csv --page details \
        --kernel-name regex:k_attention --launch-count 1 --section WarpStateStats \
        --section Occupancy --section MemoryWorkloadAnalysis --section SchedulerStats \
        --section ComputeWorkloadAnalysis --profile-from-start off \
        --log-file "$out/ncu_attn_b64.csv" $B decode "$cfg" 64 512 4 >>"$d" 2>&1 ||
        log "ncu attention details failed ($?)"
fi
log "done"
