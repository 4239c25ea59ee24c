#!/usr/bin/env python3
"""Pagoda against llama.cpp's own tools on the same GGUF files (issue 37): prefill and decode
(`pagoda bench` against `llama-bench`) and batched decode (`pagoda bench --batch` against
`llama-batched-bench`), alternated per round (the order swaps every round), same threads.

  bench/kquant_vs_llamacpp.py --pagoda build/pagoda --llama-bin LLAMA_CPP/build/bin \\
      --rounds 3 -p 512 -n 128 --batch 16,64 MODEL.gguf [MODEL.gguf ...] [--json-out FILE]

Each engine's figure per test is the median over rounds of one repetition each (after the
tools' own warm-up). Tests:
  ppP     one prompt of P tokens (llama-bench -p P; pagoda bench -p P);
  tgN     N decode steps of one sequence (llama-bench -n N; pagoda bench -n N);
  batchB  B sequences decoding together, one token each per step, 16 steps after a 1-token
          prompt each (llama-batched-bench -npp 1 -ntg 16 -npl B, its S_TG; pagoda bench
          --batch B, the same shape).
Extra llama.cpp flags (e.g. `--llama-args "-nr 1"`, no weight repacking) go to both tools.
Prints one markdown table: per model and test the two medians, their ratio and each round's
figures.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys

BATCH_STEPS = 16


def run(cmd, env=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{shlex.join(cmd)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    return p.stdout


def pagoda(a, model):
    tests = ["-p", str(a.p), "-n", str(a.n)]
    out = run([a.pagoda, "bench", "-m", model, "-t", str(a.threads), "-r", "1", "--batch",
               a.batch, "--json"] + tests + shlex.split(a.pagoda_args))
    r = json.loads(out.strip().splitlines()[-1])
    return {t["test"]: t["tokens_per_s"] for t in r["results"]}


def llamacpp(a, model):
    env = dict(os.environ, LD_LIBRARY_PATH=a.llama_bin)
    extra = shlex.split(a.llama_args)
    res = {}
    out = run([os.path.join(a.llama_bin, "llama-bench"), "-m", model, "-t", str(a.threads),
               "-r", "1", "-p", str(a.p), "-n", str(a.n), "-o", "json"] + extra, env)
    for t in json.loads(out):
        name = f"pp{t['n_prompt']}" if t["n_gen"] == 0 else f"tg{t['n_gen']}"
        res[name] = t["avg_ts"]
    batches = [int(b) for b in a.batch.split(",") if b]
    if batches:
        ctx = max(batches) * (BATCH_STEPS + 1) + 64
        out = run([os.path.join(a.llama_bin, "llama-batched-bench"), "-m", model, "-t",
                   str(a.threads), "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", "1",
                   "-ntg", str(BATCH_STEPS), "-npl", ",".join(map(str, batches)),
                   "--output-format", "jsonl"] + extra, env)
        for line in out.splitlines():
            if line.startswith("{") and '"speed_tg"' in line:
                j = json.loads(line)
                res[f"batch{j['pl']}"] = j["speed_tg"]
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--pagoda", default="build/pagoda")
    ap.add_argument("--llama-bin", required=True, help="llama.cpp's build/bin")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--batch", default="16,64")
    ap.add_argument("--llama-args", default="", help="extra flags for llama-bench and "
                    "llama-batched-bench")
    ap.add_argument("--pagoda-args", default="", help="extra flags for pagoda bench")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    raw = []
    for model in a.models:
        for rnd in range(a.rounds):
            order = [("pagoda", pagoda), ("llama.cpp", llamacpp)]
            if rnd % 2:
                order.reverse()
            for name, fn in order:
                raw.append({"model": model, "round": rnd, "engine": name,
                            "results": fn(a, model)})
                print(f"# {os.path.basename(model)} round {rnd} {name}: "
                      f"{json.dumps(raw[-1]['results'])}", file=sys.stderr, flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(raw, f, indent=1)
    print("| file | test | Pagoda | llama.cpp | ratio | Pagoda rounds | llama.cpp rounds |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for model in dict.fromkeys(r["model"] for r in raw):
        tests = dict.fromkeys(t for r in raw if r["model"] == model for t in r["results"])
        for t in tests:
            pg = [r["results"][t] for r in raw
                  if r["model"] == model and r["engine"] == "pagoda" and t in r["results"]]
            lc = [r["results"][t] for r in raw
                  if r["model"] == model and r["engine"] == "llama.cpp" and t in r["results"]]
            if not pg or not lc:
                continue
            mp, ml = statistics.median(pg), statistics.median(lc)
            print(f"| {os.path.basename(model)} | {t} | {mp:.2f} | {ml:.2f} | {mp / ml:.2f}x | "
                  f"{', '.join(f'{v:.1f}' for v in pg)} | {', '.join(f'{v:.1f}' for v in lc)} |")


if __name__ == "__main__":
    main()
