#!/bin/bash
# A/B of the panel kernels' instruction sets (not a test): the same matrices through
# bench/bench_matmul.c with PAGODA_AVX512=0 and =1, alternated ROUNDS times; prints the medians
# and the median of the per-round speed ratios (AVX-512 over AVX2) with their range.
#   bash bench/avx512_ab.sh ROUNDS "TYPES" "NS" [ROWS COLS THREADS NMAT]
#   e.g. bash bench/avx512_ab.sh 5 "3 8 12 14" "1 4 16 128" 4096 4096 2 8
# TYPES are ggml ids (3 Q4_1, 8 Q8_0, 12 Q4_K, 14 Q6_K); one thread runs pinned to the last core
# (on the 2-core VM the first core is the noisier one). Builds /tmp/bench_matmul from build/.
set -euo pipefail
cd "$(dirname "$0")/.."
R=$1 TYPES=$2 NS=$3 ROWS=${4:-4096} COLS=${5:-4096} TH=${6:-1} NM=${7:-1}
gcc -O2 -mavx2 -mfma -mf16c -Isrc -Iinclude bench/bench_matmul.c build/libpagoda.a -lcjson -lm \
    -lpthread -o /tmp/bench_matmul
pin=()
[ "$TH" = 1 ] && pin=(taskset -c "$(($(nproc) - 1))")
ms() { "${pin[@]}" env PAGODA_AVX512="$1" PACK=1 NMAT="$NM" HUGE=1 REPS=5 /tmp/bench_matmul "$TH" \
    "$ROWS" "$COLS" "$2" "$3" 2>&1 | tail -1 | grep -o '[0-9.]* ms/matrix' | cut -d' ' -f1; }
for ty in $TYPES; do
    for n in $NS; do
        a="" b=""
        for _ in $(seq "$R"); do a="$a $(ms 0 "$n" "$ty")"; b="$b $(ms 1 "$n" "$ty")"; done
        python3 - "$ty" "$n" "$a" "$b" <<'PY'
import statistics as s, sys
ty, n, a, b = sys.argv[1], sys.argv[2], [float(v) for v in sys.argv[3].split()], [float(v) for v in sys.argv[4].split()]
r = [x / y for x, y in zip(a, b)]
print(f"type {ty} n={n}: AVX2 {s.median(a):.3f} ms, AVX-512 {s.median(b):.3f} ms, "
      f"AVX-512 speed {s.median(r):.2f}x [{min(r):.2f}, {max(r):.2f}]")
PY
    done
done
