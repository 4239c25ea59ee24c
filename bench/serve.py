#!/usr/bin/env python3
"""Serving benchmark: a load generator for any OpenAI-compatible endpoint (issue 8).

Streams /v1/completions requests with Poisson arrivals (--request-rate, or inf), an optional
--max-concurrency (a comma list sweeps it), a fixed --num-prompts and a --seed, and measures
what users feel, defined exactly as vLLM's benchmarks/benchmark_serving.py does so numbers are
comparable:
  TTFT  time from sending the request to the first streamed chunk with text
  TPOT  per request (latency - TTFT) / (output tokens - 1), for requests with > 1 token
  ITL   every gap between consecutive chunks, pooled over requests
  E2EL  time from sending to the last chunk
  mean, median, p90, p99 (numpy's linear percentiles); request, output-token and total-token
  throughput over the benchmark's wall time; goodput = requests meeting every --goodput SLO / s.

Workloads (--workload):
  random         prompts of exactly --input-len tokens (built from random words, trimmed with the
                 server's /tokenize and /detokenize), exactly --output-len output tokens
                 (max_tokens + ignore_eos); --range-ratio R draws lengths uniformly in
                 [L(1-R), L(1+R)]
  shared-prefix  --num-prefixes system prompts of --prefix-len tokens; each request is one of
                 them + a unique --input-len-token question
  pareto         random prompts, output lengths Pareto(shape 1.5, scale 20) capped at
                 --max-output-len
  agent          the self-debugging loop: --conversations C in parallel, up to --rounds R each;
                 round 1 = shared system prompt + a task, then each round appends the model's
                 reply and a fixed-size --feedback-len "execution feedback" message and asks for
                 a reply of at most --reply-len tokens; a conversation stops at R rounds or when
                 the next round would pass --token-budget tokens of context. Reports prefill
                 tokens requested vs computed (from pagoda:prefix_cache_hits_total on /metrics
                 before and after), TTFT per round and total time.

--launch "CMD" starts the server itself (port 0; it reads {"event":"listening",...,"port":N}
from the server's stderr); with --prefix-caching-ab the run is repeated with
--no-prefix-caching appended to CMD and both results are reported side by side.

While a run lasts, /metrics is sampled every --metrics-interval s (KV usage, running and waiting
requests). Results: one JSON file, a readable table, PNG plots (throughput vs concurrency, TTFT
CDF, KV usage over time, TTFT per agent round).

usage: $(scripts/setup-venv.sh bench/requirements.txt)/bin/python bench/serve.py \\
           --base-url http://127.0.0.1:8000 --workload random --input-len 64 --output-len 32 \\
           --num-prompts 64 --max-concurrency 1,4,16,64 --result-dir bench/results/serve
       bench/serve.py --report A.json B.json ...   (markdown table, median over the files)
"""
import argparse
import asyncio
import json
import math
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np

WORDS = ("the of and to in is was for on that with as by at from his her an were are which this "
         "be or had not but what all when there can who been one their we him would so them if "
         "time two may then do first any my now such like our over man me even most made after "
         "also did many before must through back years where much your way well down should "
         "because each just those people how too little state good very make world still own "
         "see men work long get here between both life being under never day same another know "
         "while last might us great old year off come since against go came right used take "
         "three river garden morning ocean window letter market station forest mountain").split()
FEEDBACK = ("Traceback most recent call last File line in module error assert failed expected got "
            "TypeError ValueError IndexError KeyError test case output mismatch returned None "
            "instead of list index out of range undefined name").split()


# ---------------------------------------------------------------- server helpers

class Server:
    """A pagoda (or any) server started from a command line with --port 0."""

    def __init__(self, cmd, log_path=None):
        self.cmd = cmd
        self.log = open(log_path, "w") if log_path else None
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.port = None
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            if self.log:
                self.log.write(line)
            if line.startswith("{") and '"listening"' in line:
                self.port = json.loads(line)["port"]
                break
        if self.port is None:
            self.stop()
            raise RuntimeError(f"server did not report listening: {' '.join(cmd)}")
        # drain stderr in the background so the server never blocks on a full pipe
        import threading
        threading.Thread(target=self._drain, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.port}"

    def _drain(self):
        for line in self.proc.stderr:
            if self.log:
                self.log.write(line)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.log:
            self.log.close()


async def wait_healthy(session, base_url, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            async with session.get(base_url + "/health") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{base_url}/health did not answer 200 within {timeout} s")


def parse_metrics(text):
    """Prometheus text -> {name: value} for unlabelled-by-reason series (first sample wins)."""
    out = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m and m.group(1) not in out:
            try:
                out[m.group(1)] = float(m.group(3))
            except ValueError:
                pass
    return out


async def get_metrics(session, base_url):
    try:
        async with session.get(base_url + "/metrics") as r:
            if r.status != 200:
                return {}
            return parse_metrics(await r.text())
    except aiohttp.ClientError:
        return {}


class MetricsSampler:
    """Samples KV usage and queue lengths from /metrics while a run lasts."""

    def __init__(self, session, base_url, interval):
        self.session, self.base_url, self.interval = session, base_url, interval
        self.samples = []
        self.task = None

    async def _loop(self):
        t0 = time.perf_counter()
        while True:
            m = await get_metrics(self.session, self.base_url)
            if m:
                self.samples.append({
                    "t": time.perf_counter() - t0,
                    "kv_cache_usage_perc": m.get("pagoda:kv_cache_usage_perc",
                                                 m.get("vllm:gpu_cache_usage_perc")),
                    "num_requests_running": m.get("pagoda:num_requests_running",
                                                  m.get("vllm:num_requests_running")),
                    "num_requests_waiting": m.get("pagoda:num_requests_waiting",
                                                  m.get("vllm:num_requests_waiting")),
                })
            await asyncio.sleep(self.interval)

    def start(self):
        self.task = asyncio.ensure_future(self._loop())

    async def stop(self):
        if self.task:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass


class Tokenizer:
    """Exact token counts through the server's /tokenize and /detokenize."""

    def __init__(self, session, base_url):
        self.session, self.base_url = session, base_url
        self.n_special = None

    async def encode(self, text, special=True):
        async with self.session.post(self.base_url + "/tokenize",
                                     json={"prompt": text, "add_special_tokens": special}) as r:
            if r.status != 200:
                raise RuntimeError(f"/tokenize answered {r.status}: {await r.text()}")
            return (await r.json())["tokens"]

    async def decode(self, ids):
        async with self.session.post(self.base_url + "/detokenize", json={"tokens": ids}) as r:
            if r.status != 200:
                raise RuntimeError(f"/detokenize answered {r.status}: {await r.text()}")
            return (await r.json())["prompt"]

    async def count(self, text):
        return len(await self.encode(text))

    async def text_of_len(self, rng, n, vocab=WORDS, special=True):
        """Text of random words that tokenizes to exactly n tokens (with the BOS the server adds
        when special), or with special=False a fragment of exactly n tokens on its own."""
        if self.n_special is None:
            self.n_special = len(await self.encode("hello")) - len(await self.encode("hello", False))
        want = n - (self.n_special if special else 0)
        if want < 1:
            raise ValueError(f"a prompt of {n} tokens is too short")
        text = " " + " ".join(rng.choice(vocab) for _ in range(want + 8))
        ids = (await self.encode(text, False))[:want]
        for _ in range(8):
            text = await self.decode(ids)
            got = len(await self.encode(text, special)) - (self.n_special if special else 0)
            if got == want:
                return text
            # the detokenized cut re-merged into a different count: draw new words
            ids = (await self.encode(" " + " ".join(rng.choice(vocab) for _ in range(want + 8)),
                                     False))[:want]
        raise RuntimeError(f"could not build a prompt of exactly {n} tokens")


# ---------------------------------------------------------------- one request

class Result:
    __slots__ = ("ok", "error", "prompt_len", "output_len", "expected_output_len", "ttft",
                 "latency", "itl", "start", "server_prompt_tokens", "text", "tag")

    def __init__(self):
        self.ok = False
        self.error = ""
        self.prompt_len = self.output_len = self.expected_output_len = 0
        self.server_prompt_tokens = None
        self.ttft = self.latency = 0.0
        self.itl = []
        self.start = 0.0
        self.text = ""
        self.tag = None


async def send(session, url, model, prompt, max_tokens, prompt_len, ignore_eos=True, extra=None):
    """One streaming completion; timing as vLLM's async_request_openai_completions."""
    res = Result()
    res.prompt_len = prompt_len
    res.expected_output_len = max_tokens
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos}
    if extra:
        body.update(extra)
    st = time.perf_counter()
    res.start = st
    last = st
    chunks = 0
    try:
        async with session.post(url, json=body) as r:
            if r.status != 200:
                res.error = f"HTTP {r.status}: {(await r.text())[:200]}"
                return res
            buf = b""
            async for raw in r.content:
                buf += raw
                if not buf.endswith(b"\n"):
                    continue
                line, buf = buf.strip(), b""
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    continue
                now = time.perf_counter()
                d = json.loads(data)
                if d.get("choices"):
                    text = d["choices"][0].get("text") or ""
                    if chunks == 0:
                        res.ttft = now - st
                    else:
                        res.itl.append(now - last)
                    chunks += 1
                    last = now
                    res.text += text
                if d.get("usage"):
                    res.output_len = d["usage"].get("completion_tokens", 0)
                    res.server_prompt_tokens = d["usage"].get("prompt_tokens")
            if not res.output_len:
                res.output_len = chunks  # no usage chunk: one chunk per token
            res.latency = last - st
            res.ok = chunks > 0
            if not res.ok:
                res.error = "no chunks"
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
    return res


# ---------------------------------------------------------------- progress and metrics

class Progress:
    def __init__(self, total, label):
        self.total, self.label, self.n, self.t0 = total, label, 0, time.perf_counter()
        self.tty = sys.stderr.isatty()
        self._draw()

    def _draw(self, final=False):
        w = 30
        k = int(w * self.n / max(1, self.total))
        line = (f"\r{self.label} [{'#' * k}{'.' * (w - k)}] {self.n}/{self.total} "
                f"{time.perf_counter() - self.t0:6.1f}s")
        if self.tty or final:
            sys.stderr.write(line + ("\n" if final else ""))
            sys.stderr.flush()

    def update(self, k=1):
        self.n += k
        self._draw()

    def close(self):
        self._draw(final=True)


def stats(xs, scale=1000.0):
    """mean / median / p90 / p99 / std in ms (scale) of a list; zeros when empty."""
    if len(xs) == 0:
        return {"mean": 0.0, "median": 0.0, "p90": 0.0, "p99": 0.0, "std": 0.0}
    a = np.asarray(xs, dtype=float) * scale
    return {"mean": float(a.mean()), "median": float(np.median(a)),
            "p90": float(np.percentile(a, 90)), "p99": float(np.percentile(a, 99)),
            "std": float(a.std())}


def summarize(results, duration, goodput_slos):
    ok = [r for r in results if r.ok]
    tpots = [(r.latency - r.ttft) / (r.output_len - 1) for r in ok if r.output_len > 1]
    itls = [x for r in ok for x in r.itl]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_len for r in ok)
    good = 0
    for r in ok:
        tpot = (r.latency - r.ttft) / (r.output_len - 1) if r.output_len > 1 else 0.0
        meets = {"ttft": r.ttft * 1000, "tpot": tpot * 1000, "e2el": r.latency * 1000}
        if all(meets[k] <= v for k, v in goodput_slos.items()):
            good += 1
    out = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration if duration > 0 else 0.0,
        "output_throughput": total_out / duration if duration > 0 else 0.0,
        "total_token_throughput": (total_in + total_out) / duration if duration > 0 else 0.0,
        "ttft_ms": stats([r.ttft for r in ok]),
        "tpot_ms": stats(tpots),
        "itl_ms": stats(itls),
        "e2el_ms": stats([r.latency for r in ok]),
        "exact_output_lengths": all(r.output_len == r.expected_output_len for r in ok),
        "exact_input_lengths": all(r.server_prompt_tokens in (None, r.prompt_len) for r in ok),
    }
    if goodput_slos:
        out["goodput_slos_ms"] = goodput_slos
        out["goodput"] = good / duration if duration > 0 else 0.0
        out["goodput_completed"] = good
    return out


def print_table(title, s):
    w = 50
    print("{s:{c}^{n}}".format(s=f" {title} ", n=w, c="="))
    rows = [("Successful requests:", s["completed"]), ("Failed requests:", s["failed"]),
            ("Benchmark duration (s):", f"{s['duration_s']:.2f}"),
            ("Total input tokens:", s["total_input_tokens"]),
            ("Total generated tokens:", s["total_output_tokens"]),
            ("Request throughput (req/s):", f"{s['request_throughput']:.2f}"),
            ("Output token throughput (tok/s):", f"{s['output_throughput']:.2f}"),
            ("Total Token throughput (tok/s):", f"{s['total_token_throughput']:.2f}")]
    if "goodput" in s:
        rows.append(("Request goodput (req/s):", f"{s['goodput']:.2f}"))
    for k, v in rows:
        print(f"{k:<40}{v:<10}")
    for key, name in (("ttft_ms", "Time to First Token"), ("tpot_ms", "Time per Output Token (excl. 1st token)"),
                      ("itl_ms", "Inter-token Latency"), ("e2el_ms", "End-to-end Latency")):
        print("{s:{c}^{n}}".format(s=name, n=w, c="-"))
        m = s[key]
        short = key.split("_")[0].upper()
        for stat in ("mean", "median", "p90", "p99"):
            print(f"{stat.capitalize() if stat in ('mean', 'median') else stat.upper()} {short} (ms):".ljust(40)
                  + f"{m[stat]:<10.2f}")
    print("=" * w)


# ---------------------------------------------------------------- workloads

async def build_requests(args, tok, rng):
    """[(prompt_text, prompt_len, output_len)] for the random / shared-prefix / pareto workloads."""
    reqs = []
    n = args.num_prompts

    def draw(mean):
        lo = max(1, int(mean * (1 - args.range_ratio)))
        hi = max(lo, int(mean * (1 + args.range_ratio)))
        return rng.randint(lo, hi)

    if args.workload == "shared-prefix":
        prefixes = [await tok.text_of_len(rng, args.prefix_len) for _ in range(args.num_prefixes)]
        for i in range(n):
            p = prefixes[i % args.num_prefixes]
            q = await tok.text_of_len(rng, args.input_len, special=False)
            text = p + q
            reqs.append((text, await tok.count(text), args.output_len))
        return reqs
    for i in range(n):
        il = draw(args.input_len)
        text = await tok.text_of_len(rng, il)
        if args.workload == "pareto":
            ol = min(args.max_output_len, max(1, int(20 * rng.paretovariate(1.5))))
        else:
            ol = draw(args.output_len)
        reqs.append((text, il, ol))
    return reqs


async def arrivals(n, rate, rng):
    """Yields request indices with exponential gaps (Poisson process) or all at once (inf)."""
    for i in range(n):
        yield i
        if rate != math.inf and i + 1 < n:
            await asyncio.sleep(rng.expovariate(rate))


async def run_load(session, args, base_url, model, reqs, concurrency, label):
    url = base_url + "/v1/completions"
    sem = asyncio.Semaphore(concurrency) if concurrency else None
    prog = Progress(len(reqs), label)
    sampler = MetricsSampler(session, base_url, args.metrics_interval)
    rng = random.Random(args.seed + 1)
    m0 = await get_metrics(session, base_url)
    sampler.start()

    async def one(i):
        text, il, ol = reqs[i]
        if sem:
            async with sem:
                r = await send(session, url, model, text, ol, il)
        else:
            r = await send(session, url, model, text, ol, il)
        prog.update()
        return r

    t0 = time.perf_counter()
    tasks = []
    async for i in arrivals(len(reqs), args.request_rate, rng):
        tasks.append(asyncio.ensure_future(one(i)))
    results = await asyncio.gather(*tasks)
    duration = time.perf_counter() - t0
    await sampler.stop()
    m1 = await get_metrics(session, base_url)
    prog.close()
    s = summarize(results, duration, args.goodput)
    s["max_concurrency"] = concurrency
    s["request_rate"] = "inf" if args.request_rate == math.inf else args.request_rate
    s["prefix_cache"] = cache_delta(m0, m1)
    s["kv_samples"] = sampler.samples
    s["ttfts_s"] = [r.ttft for r in results if r.ok]
    s["requests"] = [{"prompt_len": r.prompt_len, "server_prompt_tokens": r.server_prompt_tokens,
                      "output_len": r.output_len, "expected_output_len": r.expected_output_len,
                      "ttft_s": r.ttft, "latency_s": r.latency, "ok": r.ok} for r in results]
    return s


def cache_delta(m0, m1):
    q = m1.get("pagoda:prefix_cache_queries_total", 0) - m0.get("pagoda:prefix_cache_queries_total", 0)
    h = m1.get("pagoda:prefix_cache_hits_total", 0) - m0.get("pagoda:prefix_cache_hits_total", 0)
    p = m1.get("pagoda:prompt_tokens_total", 0) - m0.get("pagoda:prompt_tokens_total", 0)
    pre = m1.get("pagoda:num_preemptions_total", 0) - m0.get("pagoda:num_preemptions_total", 0)
    return {"queries": q, "hits": h, "hit_rate": h / q if q else 0.0, "prompt_tokens": p,
            "preemptions": pre}


async def run_agent(session, args, base_url, model, label):
    """C conversations x up to R rounds; returns the summary with per-round TTFTs."""
    tok = Tokenizer(session, base_url)
    rng = random.Random(args.seed)
    system = await tok.text_of_len(rng, args.system_len)
    tasks_text = [await tok.text_of_len(rng, args.task_len, special=False)
                  for _ in range(args.conversations)]
    feedback = [[await tok.text_of_len(rng, args.feedback_len, vocab=FEEDBACK, special=False)
                 for _ in range(args.rounds)] for _ in range(args.conversations)]
    url = base_url + "/v1/completions"
    total_rounds = args.conversations * args.rounds
    prog = Progress(total_rounds, label)
    sampler = MetricsSampler(session, base_url, args.metrics_interval)
    m0 = await get_metrics(session, base_url)
    sampler.start()
    per_round = [[] for _ in range(args.rounds)]
    all_results = []
    stops = {"rounds": 0, "budget": 0, "error": 0}

    async def conversation(c):
        ctx = system + tasks_text[c]
        n_ctx = await tok.count(ctx)
        for r in range(args.rounds):
            if n_ctx + args.reply_len > args.token_budget:
                stops["budget"] += 1
                prog.update(args.rounds - r)
                return
            res = await send(session, url, model, ctx, args.reply_len, n_ctx)
            res.tag = r
            all_results.append(res)
            prog.update()
            if not res.ok:
                stops["error"] += 1
                prog.update(args.rounds - r - 1)
                return
            per_round[r].append(res.ttft)
            # the reply joins the conversation, then the execution feedback
            ctx = ctx + res.text + feedback[c][r]
            n_ctx = await tok.count(ctx)
            if args.exec_delay_ms:
                await asyncio.sleep(args.exec_delay_ms / 1000)
        stops["rounds"] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(conversation(c) for c in range(args.conversations)))
    duration = time.perf_counter() - t0
    await sampler.stop()
    m1 = await get_metrics(session, base_url)
    prog.close()
    s = summarize(all_results, duration, args.goodput)
    cd = cache_delta(m0, m1)
    requested = sum(r.server_prompt_tokens or r.prompt_len for r in all_results if r.ok)
    s["prefix_cache"] = cd
    s["prefill_tokens_requested"] = requested
    s["prefill_tokens_computed"] = requested - cd["hits"]
    s["prefill_saving"] = cd["hits"] / requested if requested else 0.0
    s["ttft_ms_per_round"] = [stats(x) | {"n": len(x)} for x in per_round]
    s["conversations"] = args.conversations
    s["rounds"] = args.rounds
    s["stopped_by"] = stops
    s["kv_samples"] = sampler.samples
    s["ttfts_s"] = [r.ttft for r in all_results if r.ok]
    return s


# ---------------------------------------------------------------- plots

def plot_all(out_dir, name, runs, agent=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    conc = [r for r in runs if r.get("max_concurrency")]
    if len({r["max_concurrency"] for r in conc}) > 1:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [r["max_concurrency"] for r in conc]
        ax.plot(xs, [r["output_throughput"] for r in conc], "o-", label="output tok/s")
        ax.plot(xs, [r["total_token_throughput"] for r in conc], "s--", label="total tok/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("max concurrency")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"{name}: throughput vs concurrency")
        ax.grid(alpha=0.3)
        ax.legend()
        p = out_dir / f"{name}_throughput_vs_concurrency.png"
        fig.tight_layout()
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in runs:
        t = np.sort(np.asarray(r["ttfts_s"]) * 1000)
        if len(t):
            ax.step(t, np.arange(1, len(t) + 1) / len(t), where="post", label=r["label"])
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{name}: TTFT CDF")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    p = out_dir / f"{name}_ttft_cdf.png"
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in runs:
        ks = [k for k in r["kv_samples"] if k["kv_cache_usage_perc"] is not None]
        if ks:
            ax.plot([k["t"] for k in ks], [100 * k["kv_cache_usage_perc"] for k in ks],
                    label=r["label"])
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("KV cache usage (%)")
    ax.set_title(f"{name}: KV usage from /metrics")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    p = out_dir / f"{name}_kv_usage.png"
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    if agent:
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in runs:
            pr = r.get("ttft_ms_per_round") or []
            ax.plot(range(1, len(pr) + 1), [x["median"] for x in pr], "o-", label=r["label"])
        ax.set_xlabel("round")
        ax.set_ylabel("median TTFT (ms)")
        ax.set_title(f"{name}: TTFT per agent round")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        p = out_dir / f"{name}_ttft_per_round.png"
        fig.tight_layout()
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


# ---------------------------------------------------------------- main

def parse_goodput(items):
    slos = {}
    for it in items or []:
        k, _, v = it.partition(":")
        if k not in ("ttft", "tpot", "e2el") or not v:
            raise SystemExit(f"--goodput wants ttft:MS tpot:MS e2el:MS, got '{it}'")
        slos[k] = float(v)
    return slos


async def one_server(args, base_url, label_suffix=""):
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:
        await wait_healthy(session, base_url)
        model = args.model
        if not model:
            async with session.get(base_url + "/v1/models") as r:
                model = (await r.json())["data"][0]["id"]
        runs = []
        if args.workload == "agent":
            s = await run_agent(session, args, base_url, model, "agent" + label_suffix)
            s["label"] = "agent" + label_suffix
            runs.append(s)
            return model, runs
        tok = Tokenizer(session, base_url)
        if args.warmup:
            # warm-up prompts of their own, so the measured prompts start with a cold prefix cache
            wrng = random.Random(args.seed + 10_000)
            warm = [await tok.text_of_len(wrng, 16) for _ in range(args.warmup)]
            await asyncio.gather(*(send(session, base_url + "/v1/completions", model, t, 4, 16)
                                   for t in warm))
        for k, c in enumerate(args.max_concurrency):
            # Each level of a sweep gets fresh prompts (seed + k): re-sending the same prompts
            # would find them in the prefix cache the previous level left behind.
            reqs = await build_requests(args, tok, random.Random(args.seed + k))
            label = (f"concurrency {c}" if c else "unbounded") + label_suffix
            s = await run_load(session, args, base_url, model, reqs, c, label)
            s["label"] = label
            runs.append(s)
        return model, runs


def report(files):
    """A markdown table of the median over repeated result files, run by run (matched by label)."""
    docs = [json.loads(Path(f).read_text()) for f in files]
    cols = [("completed", "req", "{:.0f}"), ("duration_s", "time s", "{:.1f}"),
            ("request_throughput", "req/s", "{:.2f}"), ("output_throughput", "out tok/s", "{:.1f}"),
            ("total_token_throughput", "total tok/s", "{:.1f}")]
    lat = [("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2EL")]
    head = [c[1] for c in cols] + [f"{n} {s} ms" for _, n in lat for s in ("mean", "median", "p99")]
    if "goodput" in docs[0]["runs"][0]:
        head.append("goodput req/s")
    print(f"| run | {' | '.join(head)} |")
    print("|" + " --- |" * (len(head) + 1))
    for i, run in enumerate(docs[0]["runs"]):
        reps = [d["runs"][i] for d in docs if i < len(d["runs"]) and d["runs"][i]["label"] == run["label"]]
        med = lambda f: float(np.median([f(r) for r in reps]))  # noqa: E731
        cells = [fmt.format(med(lambda r: r[k])) for k, _, fmt in cols]
        for k, _ in lat:
            cells += [f"{med(lambda r: r[k][s]):.1f}" for s in ("mean", "median", "p99")]
        if "goodput" in run:
            cells.append(f"{med(lambda r: r['goodput']):.2f}")
        print(f"| {run['label']} | {' | '.join(cells)} |")
    print(f"\n(median of {len(docs)} run(s) per row)")


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--report":
        report(sys.argv[2:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--launch", help="start the server with this command (it must accept --port 0)")
    ap.add_argument("--prefix-caching-ab", action="store_true",
                    help="with --launch: run again with --no-prefix-caching and compare")
    ap.add_argument("--server-log", help="with --launch: write the server's stderr here")
    ap.add_argument("--model", help="model name in requests (default: the first of /v1/models)")
    ap.add_argument("--workload", choices=("random", "shared-prefix", "pareto", "agent"), default="random")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--range-ratio", type=float, default=0.0)
    ap.add_argument("--max-output-len", type=int, default=512, help="pareto: cap on output length")
    ap.add_argument("--num-prefixes", type=int, default=4, help="shared-prefix: system prompts")
    ap.add_argument("--prefix-len", type=int, default=256, help="shared-prefix: tokens per system prompt")
    ap.add_argument("--request-rate", type=float, default=math.inf, help="requests/s (Poisson) or inf")
    ap.add_argument("--max-concurrency", default="0",
                    help="concurrent requests at most; a comma list sweeps (0: unbounded)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--goodput", nargs="*", help="SLOs in ms: ttft:MS tpot:MS e2el:MS")
    ap.add_argument("--warmup", type=int, default=2, help="short requests sent before measuring")
    # agent loop
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--system-len", type=int, default=256, help="agent: shared system prompt tokens")
    ap.add_argument("--task-len", type=int, default=64, help="agent: unique task tokens")
    ap.add_argument("--feedback-len", type=int, default=64, help="agent: feedback tokens per round")
    ap.add_argument("--reply-len", type=int, default=32, help="agent: reply tokens per round (max)")
    ap.add_argument("--token-budget", type=int, default=4096, help="agent: context cap per conversation")
    ap.add_argument("--exec-delay-ms", type=float, default=0.0, help="agent: 'execution' time per round")
    ap.add_argument("--metrics-interval", type=float, default=0.25)
    ap.add_argument("--request-timeout", type=float, default=3600)
    ap.add_argument("--result-dir", default="bench/results")
    ap.add_argument("--name", help="file name stem for the JSON and PNGs (default: the workload)")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args()
    args.goodput = parse_goodput(args.goodput)
    args.max_concurrency = [int(x) for x in str(args.max_concurrency).split(",")]
    if args.prefix_caching_ab and not args.launch:
        ap.error("--prefix-caching-ab needs --launch")
    name = args.name or args.workload
    out_dir = Path(args.result_dir)

    runs = []
    model = None
    variants = [("", [])]
    if args.prefix_caching_ab:
        variants = [(" (prefix cache on)", []), (" (prefix cache off)", ["--no-prefix-caching"])]
    for suffix, extra in variants:
        server = None
        base_url = args.base_url
        if args.launch:
            cmd = shlex.split(args.launch) + ["--port", "0"] + extra
            log = args.server_log + (".off" if extra else "") if args.server_log else None
            server = Server(cmd, log)
            base_url = server.base_url
        try:
            model, rs = asyncio.run(one_server(args, base_url, suffix))
        finally:
            if server:
                server.stop()
        runs.extend(rs)

    for r in runs:
        print_table(r["label"], r)
        if args.workload == "agent":
            print(f"prefill tokens requested {r['prefill_tokens_requested']}, computed "
                  f"{r['prefill_tokens_computed']} (prefix cache saved {100 * r['prefill_saving']:.1f}%)")
            print("round  n  median TTFT (ms)  p90 TTFT (ms)")
            for i, x in enumerate(r["ttft_ms_per_round"]):
                print(f"{i + 1:5d} {x['n']:2d} {x['median']:17.1f} {x['p90']:14.1f}")
        else:
            pc = r["prefix_cache"]
            print(f"prefix cache: {pc['hits']:.0f} of {pc['queries']:.0f} prompt tokens hit "
                  f"({100 * pc['hit_rate']:.1f}%); exact lengths: input {r['exact_input_lengths']}, "
                  f"output {r['exact_output_lengths']}")
    config = {k: (v if not isinstance(v, float) or math.isfinite(v) else "inf")
              for k, v in vars(args).items()}
    out = {"benchmark": "bench/serve.py", "model": model, "workload": args.workload,
           "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "config": config, "runs": runs}
    out_dir.mkdir(parents=True, exist_ok=True)
    jp = out_dir / f"{name}.json"
    jp.write_text(json.dumps(out, indent=1))
    print(f"results: {jp}")
    if not args.no_plots:
        for p in plot_all(out_dir, name, runs, agent=args.workload == "agent"):
            print(f"plot: {p}")
    return 0 if all(r["failed"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
