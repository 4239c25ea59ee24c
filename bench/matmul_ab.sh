#!/bin/bash
# A/B of two builds' CPU matmul kernels (not a test): bench/bench_matmul.c linked against two
# libpagoda.a (e.g. a worktree of the base commit's build/ and this one's), run alternately
# ROUNDS times on one pinned core (1 thread; the last core, the quieter one on the 2-vCPU VMs);
# prints per shape the median GFLOP/s of each, the median of the per-round ratios B / A with
# their range, and each side's best round.
#   bash bench/matmul_ab.sh ROUNDS LIB_A LIB_B TYPE N "ROWSxCOLS ..."
#   e.g. bash bench/matmul_ab.sh 7 /tmp/base/build/libpagoda.a build/libpagoda.a 8 128 "8192x2048"
# Environment: PAGODA_AVX512 (passed through), REPS (best of, per round; default 8).
set -euo pipefail
cd "$(dirname "$0")/.."
R=$1 LA=$2 LB=$3 TY=$4 N=$5 SHAPES=$6
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
for s in a b; do
    lib=$LA
    [ $s = b ] && lib=$LB
    gcc -O2 -mavx2 -mfma -mf16c -Isrc -Iinclude bench/bench_matmul.c "$lib" -lcjson -lm -lpthread \
        -o "$d/bm_$s"
done
core=$(($(nproc) - 1))
for sh in $SHAPES; do
    rows=${sh%x*} cols=${sh#*x} a="" b=""
    for _ in $(seq "$R"); do
        for s in a b; do
            g=$(taskset -c "$core" env PACK=1 NMAT=1 HUGE=1 REPS="${REPS:-8}" "$d/bm_$s" 1 "$rows" \
                "$cols" "$N" "$TY" | tail -1 | grep -o '[0-9.]* GFLOP' | cut -d' ' -f1)
            if [ $s = a ]; then a="$a $g"; else b="$b $g"; fi
        done
    done
    python3 - "$TY" "$N" "$sh" "$a" "$b" <<'PY'
import statistics as st, sys
ty, n, sh = sys.argv[1:4]
a, b = ([float(v) for v in x.split()] for x in sys.argv[4:6])
q = [y / x for x, y in zip(a, b)]
print(f"type {ty} {sh} n={n}: A {st.median(a):.1f} B {st.median(b):.1f} GFLOP/s (best {max(a):.1f}, "
      f"{max(b):.1f}); B/A median {st.median(q):.2f}x [{min(q):.2f}, {max(q):.2f}]")
PY
done
