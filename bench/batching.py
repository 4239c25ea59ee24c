#!/usr/bin/env python3
"""Continuous vs static batching on the classic workload (issue 4, proof 4).

200 requests whose output lengths follow a Pareto distribution (shape 1.5, scale 20, capped at
512), short prompts, `ignore_eos` so each request generates exactly its drawn length. Both runs use
the same batch size (--max-num-seqs B): static batching admits a new batch only when the whole
previous batch has finished; continuous batching refills a slot at the very next step.

Reports output tokens/s (median of --reps runs), the ratio, and the mean batch-slot utilization
while requests are waiting (time-weighted over steps), and plots utilization over time (PNG).

usage: bench/batching.py [--model M] [--batch 32] [--requests 200] [--reps 3] [--out DIR]
Run with the bench virtualenv: $(bash scripts/setup-venv.sh bench/requirements.txt)/bin/python
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def workload(n, seed, cap=512):
    rng = random.Random(seed)
    words = ("the cat dog sun tree river house bird moon star child story green blue small "
             "happy walked found garden morning ocean").split()
    reqs = []
    for i in range(n):
        out = min(cap, int(20 * rng.paretovariate(1.5)))
        prompt = " ".join(rng.choice(words) for _ in range(rng.randrange(8, 40)))
        reqs.append({"id": i, "prompt": prompt, "max_tokens": out, "temperature": 0,
                     "ignore_eos": True})
    return reqs


def run(binary, model, reqs, batch, static, threads, tmp):
    tag = "static" if static else "continuous"
    inp, out = tmp / f"{tag}.in.jsonl", tmp / f"{tag}.out.jsonl"
    stats, trace = tmp / f"{tag}.stats.json", tmp / f"{tag}.trace.txt"
    inp.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    cmd = [str(binary), "batch", "-m", str(model), "--input", str(inp), "--output", str(out),
           "--max-num-seqs", str(batch), "--max-num-batched-tokens", "512", "--stats", str(stats),
           "--trace", str(trace), "--no-progress"]
    if threads:
        cmd += ["-t", str(threads)]
    if static:
        cmd.append("--static-batching")
    subprocess.run(cmd, check=True, capture_output=True)
    st = json.loads(stats.read_text())
    steps = [tuple(float(x) for x in l.split()) for l in trace.read_text().splitlines()]
    # utilization while requests wait: each step weighted by its duration
    busy = tot = 0.0
    prev = 0.0
    series = []
    for t, running, waiting, _tokens in steps:
        dt = t - prev
        prev = t
        series.append((t, running / batch))
        if waiting > 0:
            busy += dt * running / batch
            tot += dt
    util = busy / tot if tot else float("nan")
    results = [json.loads(l) for l in out.read_text().splitlines()]
    return {"tokens_per_s": st["generation_tokens"] / st["seconds"], "seconds": st["seconds"],
            "generation_tokens": st["generation_tokens"], "steps": st["steps"],
            "util_while_waiting": util, "series": series, "results": results}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--binary", default=str(ROOT / "build" / "pagoda"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cap", type=int, default=512, help="cap on output lengths (512 per the workload)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args()
    outdir = Path(a.out)
    outdir.mkdir(parents=True, exist_ok=True)
    reqs = workload(a.requests, a.seed, a.cap)
    runs = {"static": [], "continuous": []}
    with tempfile.TemporaryDirectory() as td:
        for rep in range(a.reps):
            for mode in ("static", "continuous"):
                r = run(a.binary, a.model, reqs, a.batch, mode == "static", a.threads, Path(td))
                runs[mode].append(r)
                print(f"rep {rep} {mode}: {r['tokens_per_s']:.1f} tok/s, {r['seconds']:.1f} s, "
                      f"{r['steps']} steps, utilization while waiting {r['util_while_waiting']:.3f}",
                      file=sys.stderr)
    # greedy outputs must not depend on the batching policy
    for a_, b_ in zip(runs["static"][0]["results"], runs["continuous"][0]["results"]):
        assert "error" not in a_ and "error" not in b_, (a_, b_)
        assert a_["token_ids"] == b_["token_ids"], f"request {a_['id']} differs between policies"
    summary = {}
    for mode, rs in runs.items():
        med = sorted(rs, key=lambda r: r["tokens_per_s"])[len(rs) // 2]
        summary[mode] = {"tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in rs),
                         "tokens_per_s_all": [round(r["tokens_per_s"], 2) for r in rs],
                         "util_while_waiting_median": statistics.median(r["util_while_waiting"] for r in rs),
                         "steps": med["steps"], "generation_tokens": med["generation_tokens"],
                         "series": med["series"]}
    ratio = summary["continuous"]["tokens_per_s_median"] / summary["static"]["tokens_per_s_median"]
    report = {"model": a.model, "batch": a.batch, "requests": a.requests, "reps": a.reps,
              "ratio_continuous_over_static": ratio,
              **{m: {k: v for k, v in s.items() if k != "series"} for m, s in summary.items()}}
    (outdir / "batching.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharey=True)
        for ax, mode in zip(axes, ("static", "continuous")):
            ts, us = zip(*summary[mode]["series"])
            ax.step(ts, us, where="post", lw=0.8)
            ax.set_title(f"{mode} batching, batch {a.batch}: "
                         f"{summary[mode]['tokens_per_s_median']:.1f} output tokens/s, "
                         f"{100 * summary[mode]['util_while_waiting_median']:.0f}% slots busy while requests wait")
            ax.set_ylabel("slot utilization")
            ax.set_ylim(0, 1.05)
        axes[1].set_xlabel("seconds")
        fig.tight_layout()
        fig.savefig(outdir / "batching_utilization.png", dpi=110)
        print(f"plot: {outdir / 'batching_utilization.png'}", file=sys.stderr)
    except ImportError:
        print("matplotlib missing: no plot (use the bench virtualenv)", file=sys.stderr)


if __name__ == "__main__":
    main()
