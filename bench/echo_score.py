#!/usr/bin/env python3
"""Prompt scoring throughput: /v1/completions with echo + logprobs (lm-evaluation-harness's
loglikelihood request) against the same prompts without them (prefill alone).

Starts `pagoda serve` itself (port 0), sends --requests token-id prompts of --prompt-len random
ids all at once (as lm-eval sends a batch), each with max_tokens 1, and times the whole batch:
  scored  echo: true, logprobs: 1   (every prompt position's logits and log-softmax)
  plain   no echo, no logprobs      (only the last position's logits)
Prefix caching is off so repeated runs do not hit the cache. Reports prompt tokens/s of each,
the median over --reps alternating runs, and scored/plain.

usage: python bench/echo_score.py [--model M] [--prompt-len 512] [--requests 16] [--reps 5]
                                  [--server-args "--max-num-seqs 64"]
"""
import argparse
import json
import random
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent


def start(binary, model, extra):
    cmd = [binary, "serve", "-m", model, "--port", "0", "--no-prefix-caching"] + extra
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         cwd=ROOT)
    for line in p.stderr:
        if '"listening"' in line:
            port = json.loads(line)["port"]
            break
    else:
        raise SystemExit(f"server exited {p.wait()}")
    url = f"http://127.0.0.1:{port}"
    while requests.get(url + "/health", timeout=5).status_code != 200:
        time.sleep(0.2)
    return p, url


def batch(url, prompts, scored):
    body = {"max_tokens": 1, "temperature": 0}
    if scored:
        body.update(echo=True, logprobs=1)

    def one(ids):
        r = requests.post(url + "/v1/completions", json=dict(body, prompt=ids), timeout=3600)
        assert r.status_code == 200, r.text
        if scored:
            assert len(r.json()["choices"][0]["logprobs"]["tokens"]) == len(ids) + 1
        return r

    t = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as ex:
        list(ex.map(one, prompts))
    return sum(map(len, prompts)) / (time.perf_counter() - t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=str(ROOT / "build" / "pagoda"))
    ap.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--server-args", default="")
    a = ap.parse_args()
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 30000) for _ in range(a.prompt_len)]
               for _ in range(a.requests)]
    p, url = start(a.binary, a.model, shlex.split(a.server_args))
    try:
        batch(url, prompts[:2], True)  # warm up
        res = {"scored": [], "plain": []}
        for _ in range(a.reps):
            for k in ("plain", "scored"):
                res[k].append(batch(url, prompts, k == "scored"))
    finally:
        p.terminate()
        p.wait()
    med = {k: statistics.median(v) for k, v in res.items()}
    print(json.dumps({"prompt_len": a.prompt_len, "requests": a.requests,
                      "server_args": a.server_args, "runs": res, "median": med,
                      "scored_over_plain": med["scored"] / med["plain"]}))
    for k, v in res.items():
        print(f"{k:7s} prompt tokens/s: median {med[k]:8.1f}  runs "
              + " ".join(f"{x:.1f}" for x in v), file=sys.stderr)
    print(f"scored / plain: {med['scored'] / med['plain']:.3f}", file=sys.stderr)


if __name__ == "__main__":
    main()
