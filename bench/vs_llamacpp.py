#!/usr/bin/env python3
"""Pagoda vs llama.cpp on the same GGUF files, same machine, same threads, run alternately.

For each model and round: `pagoda bench --json` then bench/llamacpp_baseline.py --json (the
order swaps every round), so both see the same moments of a shared machine. Prints one
markdown table: per test the median tokens/s of each engine over all rounds' repetitions, the
ratio, and both as fractions of the highest roofline `pagoda bench` measured for the model
(bandwidth for tg/batch1, min(bandwidth, compute) for batches, compute for pp).

  bench/vs_llamacpp.py --pagoda build-bench/pagoda \\
      --python ~/.cache/pagoda/venv-llamacpp/bin/python --rounds 2 --reps 3 \\
      -p 512 -n 128 --batch 16,64 MODEL.gguf [MODEL.gguf ...] [--json-out FILE]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_json(cmd):
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def collect(a):
    common = ["-m", None, "-p", str(a.p), "-n", str(a.n), "-t", str(a.threads), "-r",
              str(a.reps), "--batch", a.batch, "--json"]
    raw = []
    for model in a.models:
        for rnd in range(a.rounds):
            args = [model if v is None else v for v in common]
            order = ["pagoda", "llama.cpp"] if rnd % 2 == 0 else ["llama.cpp", "pagoda"]
            for eng in order:
                if eng == "pagoda":
                    r = run_json([a.pagoda, "bench"] + args)
                else:
                    r = run_json([a.python, os.path.join(HERE, "llamacpp_baseline.py")] + args)
                raw.append({"model": model, "round": rnd, "engine": eng, "result": r})
                print(f"# {os.path.basename(model)} round {rnd} {eng} done", file=sys.stderr)
    return raw


def table(raw):
    """Per (model, test): medians of each engine's tokens/s over every round and repetition
    (pagoda bench reports one median per round), ratio, and both against the highest roofline
    pagoda bench measured for that model (its probes are best-of measurements: a lower reading
    is another process on the machine during the probe, not a slower machine)."""
    rows = []
    for model in dict.fromkeys(r["model"] for r in raw):
        pg, lc, roof = {}, {}, {}
        for r in raw:
            if r["model"] != model:
                continue
            for t in r["result"]["results"]:
                if r["engine"] == "pagoda":
                    pg.setdefault(t["test"], []).append(t["tokens_per_s"])
                    roof.setdefault(t["test"], []).append(t["roofline_tokens_per_s"])
                else:
                    lc.setdefault(t["test"], []).extend(t["runs"])
        for test in pg:
            if test not in lc:
                continue
            p, l, rf = statistics.median(pg[test]), statistics.median(lc[test]), max(roof[test])
            rows.append((os.path.basename(model), test, p, l, p / l, p / rf, l / rf))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--from-json", default="", help="re-print the table of an earlier --json-out")
    ap.add_argument("--pagoda", default="build-bench/pagoda")
    ap.add_argument("--python", default=os.path.expanduser("~/.cache/pagoda/venv-llamacpp/bin/python"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--batch", default="16,64")
    ap.add_argument("--json-out", default="")
    a = ap.parse_args()

    if a.from_json:
        with open(a.from_json) as f:
            raw = json.load(f)["raw"]
    else:
        raw = collect(a)
    rows = table(raw)
    print("| model | test | Pagoda t/s | llama.cpp t/s | Pagoda / llama.cpp | Pagoda of roofline |"
          " llama.cpp of roofline |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for m, t, p, l, ratio, fp, fl in rows:
        print(f"| {m} | {t} | {p:.2f} | {l:.2f} | {ratio:.2f}x | {100 * fp:.1f}% | {100 * fl:.1f}% |")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"rows": rows, "raw": raw}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
