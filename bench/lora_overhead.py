"""The cost of a LoRA adapter: `pagoda bench` without and with `--lora`, alternated run by run
(this VM's speed drifts within minutes, so only alternation gives a stable ratio), and the
median of each figure's with/without ratio.

    python bench/lora_overhead.py --adapter /tmp/lora-r16 [-m MODEL] [--runs 5]
    (make the adapter with bench/make_lora_adapter.py)
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bench(pagoda, model, extra, args):
    cmd = [pagoda, "bench", "-m", model, "-p", str(args.p), "-n", str(args.n), "-r", "3",
           "--batch", args.batch, "--json"] + extra
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return {r["test"]: r["tokens_per_s"] for r in json.loads(out)["results"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--adapter", required=True)
    ap.add_argument("-m", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--pagoda", default=str(ROOT / "build" / "pagoda"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--batch", default="4,16")
    args = ap.parse_args()
    base, lora = {}, {}
    for i in range(args.runs):
        for store, extra in ((base, []), (lora, ["--lora", args.adapter])):
            for k, v in bench(args.pagoda, args.m, extra, args).items():
                store.setdefault(k, []).append(v)
        print(f"run {i + 1}/{args.runs} done", file=sys.stderr)
    rows = []
    for k in base:
        ratios = [b / a for a, b in zip(base[k], lora[k])]
        rows.append({"test": k, "base_tokens_per_s": statistics.median(base[k]),
                     "lora_tokens_per_s": statistics.median(lora[k]),
                     "ratio_median": statistics.median(ratios)})
        print(f"{k:10s} base {rows[-1]['base_tokens_per_s']:8.1f} t/s  lora "
              f"{rows[-1]['lora_tokens_per_s']:8.1f} t/s  ratio {rows[-1]['ratio_median']:.3f}")
    print(json.dumps({"model": args.m, "adapter": args.adapter, "runs": args.runs,
                      "results": rows}))


if __name__ == "__main__":
    main()
