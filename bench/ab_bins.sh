#!/bin/bash
# A/B of two pagoda binaries end to end (not a test): `pagoda bench ARGS --json` with binary A,
# and B, ROUNDS times (A first in odd rounds, B first in even ones); prints each test's per-round
# tokens/s and the median of the per-round ratios B / A with their range. Alternating spreads a
# shared machine's drift over both sides.
#   bash bench/ab_bins.sh ROUNDS BIN_A BIN_B [pagoda bench arguments...]
#   e.g. bash bench/ab_bins.sh 5 /tmp/base/build/pagoda build/pagoda -p 512 -n 32 -r 3 -t 2
set -euo pipefail
R=$1 A=$2 B=$3
shift 3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in $(seq "$R"); do
    if ((i % 2)); then
        "$A" bench "$@" --json >"$out/a$i.json"
        "$B" bench "$@" --json >"$out/b$i.json"
    else
        "$B" bench "$@" --json >"$out/b$i.json"
        "$A" bench "$@" --json >"$out/a$i.json"
    fi
done
python3 - "$out" "$R" <<'PY'
import json, statistics as st, sys
d, r = sys.argv[1], int(sys.argv[2])
load = lambda s, i: {t["test"]: t["tokens_per_s"] for t in json.load(open(f"{d}/{s}{i}.json"))["results"]}
a = [load("a", i) for i in range(1, r + 1)]
b = [load("b", i) for i in range(1, r + 1)]
for t in a[0]:
    ra = [x[t] for x in a]; rb = [x[t] for x in b]
    q = [y / x for x, y in zip(ra, rb)]
    print(f"{t}: A {', '.join(f'{v:.1f}' for v in ra)} | B {', '.join(f'{v:.1f}' for v in rb)} t/s"
          f" | B/A median {st.median(q):.2f}x [{min(q):.2f}, {max(q):.2f}]")
PY
