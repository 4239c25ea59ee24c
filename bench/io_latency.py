#!/usr/bin/env python3
"""What the I/O thread adds while the engine computes (issue 34): /health latency and a small
greedy request's time to first token, p50 and p99, while grammar requests whose masks run to
the README's work limit (10^7 parse steps a mask, about 0.1 s) keep the engine busy. Two or more
builds are measured alternately, round by round (the order swapped each round), on the same
model and threads; each round starts its own server.

Before the engine published its events outside the step (issue 34), pgd_engine_poll took the
lock a step held through sampling and masking, so the I/O thread could wait for a whole mask.

usage: python3 bench/io_latency.py --bin before=/tmp/before/build/pagoda --bin after=build/pagoda
           [--model tests/data/models/llama-2-tiny-random.gguf] [--rounds 3] [--seconds 20]
"""
import argparse
import json
import re
import statistics
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# a grammar whose first mask runs to the work limit (tests/integration/test_grammar.py)
HEAVY = {"prompt": "Once", "max_tokens": 4, "temperature": 0,
         "grammar": "root ::= x{0,30} [^\\n]*\nx ::= [^\\n]{0,30}"}


def start(binary, model, threads):
    p = subprocess.Popen([binary, "serve", "-m", model, "--port", "0", "-t", str(threads),
                         ], stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        m = re.search(r'"listening".*"port":(\d+)', line)
        if m:
            port = int(m.group(1))
            break
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if urllib.request.urlopen(url + "/health", timeout=5).status == 200:
                return p, url
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{binary}: not ready")


def post(url, body, stream=False):
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=120)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] * 1000


def one_round(binary, model, threads, seconds):
    p, url = start(binary, model, threads)
    stop = threading.Event()
    heavy = [0]

    def load():
        while not stop.is_set():
            try:
                post(url + "/v1/completions", HEAVY).read()
            except OSError:
                pass  # the work limit ends it with a 500: that is the load
            heavy[0] += 1

    loaders = [threading.Thread(target=load) for _ in range(2)]
    for t in loaders:
        t.start()
    time.sleep(1)
    health, ttft = [], []
    t_end = time.time() + seconds
    while time.time() < t_end:
        t0 = time.perf_counter()
        urllib.request.urlopen(url + "/health", timeout=30).read()
        health.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        r = post(url + "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 2,
                                           "temperature": 0, "stream": True})
        for line in r:
            if line.startswith(b"data: {") and b'"text":""' not in line:
                ttft.append(time.perf_counter() - t0)
                break
        r.read()
        time.sleep(0.05)
    stop.set()
    for t in loaders:
        t.join()
    p.terminate()
    p.wait()
    return health, ttft, heavy[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", action="append", required=True, help="NAME=PATH")
    ap.add_argument("--model", default=str(ROOT / "tests/data/models/llama-2-tiny-random.gguf"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    bins = [b.split("=", 1) for b in a.bin]
    res = {n: {"health": [], "ttft": [], "heavy": 0} for n, _ in bins}
    for r in range(a.rounds):
        order = bins if r % 2 == 0 else bins[::-1]
        for name, path in order:
            h, t, n = one_round(path, a.model, a.threads, a.seconds)
            res[name]["health"] += h
            res[name]["ttft"] += t
            res[name]["heavy"] += n
            print(f"round {r} {name}: /health p50 {pct(h, .5):.2f} ms p99 {pct(h, .99):.2f} ms; "
                  f"TTFT p50 {pct(t, .5):.1f} ms p99 {pct(t, .99):.1f} ms; {n} heavy requests",
                  flush=True)
    print("\nall rounds (medians of the pooled samples, ms):")
    print("| build | /health p50 | /health p99 | TTFT p50 | TTFT p99 | samples | heavy requests |")
    print("|---|---|---|---|---|---|---|")
    for name, _ in bins:
        h, t = res[name]["health"], res[name]["ttft"]
        print(f"| {name} | {pct(h, .5):.2f} | {pct(h, .99):.2f} | {pct(t, .5):.1f} | "
              f"{pct(t, .99):.1f} | {len(h)} | {res[name]['heavy']} |")


if __name__ == "__main__":
    main()
