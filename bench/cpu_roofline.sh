#!/usr/bin/env bash
# CPU backend against the hardware roofline (issue 3): `pagoda bench --json` on SmolLM2-135M
# (Q4_1, Q8_0, F16) and the TinyLlama-1.1B-shaped random model (Q8_0, F16), then one Markdown
# table per model for bench/RESULTS.md. Not a test; needs a quiet machine to mean anything.
#   bench/cpu_roofline.sh [PAGODA] [THREADS] [REPS]
# Models: models/ (scripts/fetch-default-model.sh) and ~/.cache/pagoda/bench-models
# (scripts/make_bench_models.py). JSON lands in bench/results/cpu_roofline/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pagoda=${1:-$root/build/pagoda}
threads=${2:-2}
reps=${3:-3}
bm=${PAGODA_BENCH_MODELS:-$HOME/.cache/pagoda/bench-models}
out=$root/bench/results/cpu_roofline
mkdir -p "$out"
models=(
    "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    "$bm/SmolLM2-135M-Instruct.Q8_0.gguf"
    "$bm/SmolLM2-135M-Instruct.F16.gguf"
    "$bm/tinyllama-1.1b-random.Q8_0.gguf"
    "$bm/tinyllama-1.1b-random.F16.gguf"
)
for m in "${models[@]}"; do
    [ -f "$m" ] || { echo "missing $m (see the header)" >&2; continue; }
    name=$(basename "$m" .gguf)
    echo "== $name (load: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    "$pagoda" bench -m "$m" -t "$threads" -p 512 -n 128 -r "$reps" --batch 1,16,64 --json \
        >"$out/$name.json"
done
python3 - "$out" <<'EOF'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    d = json.loads(f.read_text())
    print(f"\n{f.stem}: {d['weight_type']} weights, {d['weight_bytes_per_step'] / 1e6:.1f} MB per "
          f"step; probes {d['bandwidth_gbs']:.2f} GB/s, {d['peak_gflops']:.1f} GFLOP/s, the "
          f"better of before / after the tests: "
          f"{' / '.join(f'{v:.2f}' for v in d['bandwidth_gbs_before_after'])} GB/s, "
          f"{' / '.join(f'{v:.1f}' for v in d['peak_gflops_before_after'])} GFLOP/s "
          f"({d['threads']} threads, median of {d['reps']})\n")
    print("| test | t/s | roofline t/s | fraction | bound |\n| --- | --- | --- | --- | --- |")
    for r in d["results"]:
        print(f"| {r['test']} | {r['tokens_per_s']:.2f} | {r['roofline_tokens_per_s']:.2f} | "
              f"{100 * r['fraction']:.1f}% | {r['bound']} |")
EOF
