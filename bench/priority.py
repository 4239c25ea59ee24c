#!/usr/bin/env python3
"""Priority scheduling benchmark: what `--scheduling-policy priority` buys interactive requests
on a server saturated by batch work, and what it costs the batch work.

A `pagoda serve` is started per policy (fcfs and priority, alternated --runs times). --background
workers each stream low-priority completions back to back (--bg-input-len words of prompt,
--bg-output-len tokens), more of them than --max-num-seqs, so requests always wait. After
--settle seconds, --interactive short requests (--int-output-len tokens) arrive every
--interval seconds with priority -1 (0 under fcfs, which takes no other). Reported per policy:
the interactive requests' TTFT and end-to-end latency (median and p90, ms) and the background's
output tokens/s over the interactive window; then the medians over the runs and the ratios
priority / fcfs. One JSON file under --result-dir holds every run. --background 0 measures the
interactive requests on an idle server (the baseline).

usage: $(scripts/setup-venv.sh bench/requirements.txt)/bin/python bench/priority.py \\
           --runs 3 --result-dir bench/results/priority
"""
import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import serve  # noqa: E402  (Server, send, WORDS)

ROOT = Path(__file__).resolve().parent.parent


def prompt(rng, words):
    return " ".join(rng.choice(serve.WORDS) for _ in range(words))


async def one_run(args, policy, seed):
    cmd = [args.pagoda, "serve", "-m", args.model, "--port", "0", "-t", str(args.threads),
           "--max-num-seqs", str(args.max_num_seqs), "--scheduling-policy", policy,
           "--no-log-requests"]
    srv = serve.Server(cmd)
    rng = random.Random(seed)
    url = srv.base_url + "/v1/completions"
    timeout = aiohttp.ClientTimeout(total=3600)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await serve.wait_healthy(session, srv.base_url)
            model = (await (await session.get(srv.base_url + "/v1/models")).json())["data"][0]["id"]
            await serve.send(session, url, model, "warm up", 4, 2)
            stop, bg_tokens = asyncio.Event(), []

            async def background():
                while not stop.is_set():
                    r = await serve.send(session, url, model, prompt(rng, args.bg_input_len),
                                         args.bg_output_len, args.bg_input_len)
                    if not r.ok:
                        raise RuntimeError(r.error)
                    # tokens streamed, with when the request started and ended
                    bg_tokens.append((r.start, r.start + r.latency, r.output_len))

            workers = [asyncio.create_task(background()) for _ in range(args.background)]
            await asyncio.sleep(args.settle)
            extra = {"priority": -1} if policy == "priority" else {}
            t0 = time.perf_counter()
            tasks = []
            for _ in range(args.interactive):
                tasks.append(asyncio.create_task(serve.send(
                    session, url, model, prompt(rng, args.int_input_len), args.int_output_len,
                    args.int_input_len, extra=extra)))
                await asyncio.sleep(args.interval)
            inter = await asyncio.gather(*tasks)
            t1 = time.perf_counter()
            stop.set()
            await asyncio.gather(*workers)
    finally:
        srv.stop()
    bad = [r.error for r in inter if not r.ok]
    if bad:
        raise RuntimeError(bad[0])
    # background tokens inside [t0, t1], pro rata for requests that straddle it
    toks = 0.0
    for s, e, n in bg_tokens:
        if e > s:
            toks += n * max(0.0, min(e, t1) - max(s, t0)) / (e - s)
    ttft = [r.ttft * 1e3 for r in inter]
    e2e = [r.latency * 1e3 for r in inter]
    return {"policy": policy, "ttft_median_ms": float(np.median(ttft)),
            "ttft_p90_ms": float(np.percentile(ttft, 90)),
            "e2e_median_ms": float(np.median(e2e)), "e2e_p90_ms": float(np.percentile(e2e, 90)),
            "background_tok_s": toks / (t1 - t0), "window_s": t1 - t0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pagoda", default=str(ROOT / "build" / "pagoda"))
    ap.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--background", type=int, default=16, help="low-priority streams")
    ap.add_argument("--bg-input-len", type=int, default=96, help="background prompt words")
    ap.add_argument("--bg-output-len", type=int, default=96)
    ap.add_argument("--interactive", type=int, default=12)
    ap.add_argument("--int-input-len", type=int, default=24, help="interactive prompt words")
    ap.add_argument("--int-output-len", type=int, default=16)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between interactive")
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--result-dir", default=str(ROOT / "bench" / "results" / "priority"))
    args = ap.parse_args()
    runs = []
    for i in range(args.runs):
        for policy in (("fcfs", "priority") if i % 2 == 0 else ("priority", "fcfs")):
            r = asyncio.run(one_run(args, policy, seed=i))
            runs.append(r)
            print(json.dumps(r), flush=True)
    out = Path(args.result_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "priority.json").write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))
    keys = ("ttft_median_ms", "ttft_p90_ms", "e2e_median_ms", "e2e_p90_ms", "background_tok_s")
    med = {p: {k: float(np.median([r[k] for r in runs if r["policy"] == p])) for k in keys}
           for p in ("fcfs", "priority")}
    print(f"\nmedians of {args.runs} runs per policy\n")
    print("| | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for p in ("fcfs", "priority"):
        print(f"| {p} | " + " | ".join(f"{med[p][k]:.1f}" for k in keys) + " |")
    print("| priority / fcfs | " +
          " | ".join(f"{med['priority'][k] / med['fcfs'][k]:.2f}" if med['fcfs'][k] else "-"
                     for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
