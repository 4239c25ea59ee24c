#!/usr/bin/env python3
"""Decode speed at long contexts for each KV element type, Pagoda against llama.cpp on the same
GGUF file, same threads, run alternately (issue 38).

For each depth, KV type and round: `pagoda bench -p 0 -n N -d DEPTH --kv-dtype T` and
`llama-bench -p 0 -n N -d DEPTH -ctk T -ctv T -fa 1` (llama.cpp quantizes V only with flash
attention; `--repack 0`: the llama.cpp of llama-cpp-python 0.3.36 crashes in llama-bench with
-d and its CPU repack buffers on), the order swapping every round. Prints one markdown table: per depth and type the
median decode tokens/s of each engine over the rounds (each round itself a median of -r runs),
their ratio, and the KV bytes one token takes in Pagoda's cache.

  python bench/kv_types.py --pagoda build/pagoda --llama-bench /tmp/.../llama-bench \\
      -m models/SmolLM2-135M-Instruct.Q4_1.gguf --depths 2048,8128 --types f32,f16,q8_0,q4_0

Not run by CI (llama.cpp is built by hand under /tmp: see bench/llamacpp_baseline.py)."""
import argparse
import json
import statistics
import subprocess


def pagoda_tg(a, depth, t):
    out = subprocess.run([a.pagoda, "bench", "-m", a.model, "-p", "0", "-n", str(a.n), "-d",
                          str(depth), "-t", str(a.threads), "-r", str(a.reps), "--batch", "1",
                          "--kv-dtype", t, "--json"], check=True, capture_output=True,
                         text=True).stdout
    j = json.loads(out.strip().splitlines()[-1])
    return next(r["tokens_per_s"] for r in j["results"] if r["test"].startswith("tg"))


def llama_tg(a, depth, t):
    """None where llama-bench refuses the type (its -ctk takes no f32)."""
    p = subprocess.run([a.llama_bench, "-m", a.model, "-p", "0", "-n", str(a.n), "-d",
                          str(depth), "-t", str(a.threads), "-r", str(a.reps), "-ctk", t,
                          "-ctv", t, "-fa", "1", "--repack", "0", "-o", "json"],
                       capture_output=True, text=True)
    if p.returncode:
        return None
    rows = json.loads(p.stdout)
    return next(r["avg_ts"] for r in rows if r["n_gen"] > 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pagoda", default="build/pagoda")
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("-m", "--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--depths", default="2048,8128")
    ap.add_argument("--types", default="f32,f16,q8_0,q4_0")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    print("| depth | KV K/V | Pagoda tg tok/s | llama.cpp tg tok/s | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for depth in [int(d) for d in a.depths.split(",")]:
        for t in a.types.split(","):
            p, l = [], []
            for rnd in range(a.rounds):
                for eng in (("p", "l") if rnd % 2 == 0 else ("l", "p")):
                    if eng == "p":
                        p.append(pagoda_tg(a, depth, t))
                    else:
                        l.append(llama_tg(a, depth, t))
            mp = statistics.median(p)
            if None in l:
                print(f"| {depth} | {t}/{t} | {mp:.2f} | (not a llama-bench type) | |", flush=True)
                continue
            ml = statistics.median(l)
            print(f"| {depth} | {t}/{t} | {mp:.2f} | {ml:.2f} | {mp / ml:.2f} |", flush=True)


if __name__ == "__main__":
    main()
