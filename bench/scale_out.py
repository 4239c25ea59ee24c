#!/usr/bin/env python3
"""Replicas of `pagoda serve` behind SGLang's model gateway (PyPI sglang-router) on 127.0.0.1:
cache-aware against round-robin routing on a multi-tenant workload, and requests lost when a
replica is killed (SIGKILL) or stopped (SIGTERM) mid-run (issue 36).

Workload: `--tenants` system prompts of `--prefix-words` random words each (1,000+ tokens with
stories260K's tokenizer), `--questions` short questions per tenant, shuffled, sent by
`--concurrency` users; every request streamed (TTFT = time to the first SSE chunk) unless
--nonstream-fraction says otherwise. The model: stories260K's tokenizer on a random Llama of
hidden 256 x 4 layers with a 4,096-token context (written once under --workdir), so a prefix's
prefill costs something and its blocks fill a small --kv-cache-memory. Each policy gets fresh
replicas (empty caches) and its own router; policies alternate over --rounds.

Per run it reports: prefix-cache hit rate (the replicas' pagoda:prefix_cache_hits_total over
queries), TTFT p50/p90, output tokens/s, non-streamed requests that failed, streams cut (the
stream broke or ended without [DONE]), and with --fault: when the faulted replica left the
router's rotation (its health checks; seconds after the fault) and, after a kill, when the
restarted replica served again.

  python bench/scale_out.py --pagoda build/pagoda --router $VENV/bin/sglang-router \\
      [--policies cache_aware,round_robin] [--rounds 3] [--fault none|kill|term] [--json]

Needs the router venv (tests/routers/requirements.txt: sglang-router, gguf, numpy, requests).
tests/routers/test_scale_out.py runs it small in CI."""
import argparse
import json
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from server_util import Server  # noqa: E402

STORIES = ROOT / "tests" / "data" / "models" / "stories260K.gguf"
WORDS = ("once upon a time there was a little girl named lily she loved to play outside in the "
         "park with her big red ball and her friend tom the sun was warm and the sky was blue "
         "one day they found a small box under an old tree near the river").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_model(out):
    """stories260K's tokenizer (every tokenizer.* key copied) on a random F32 Llama of hidden 256,
    4 layers of 8 heads of 32 (4 KV heads), FFN 768 and a 4,096-token context."""
    import gguf
    out = Path(out)
    if out.exists():
        return out
    r = gguf.GGUFReader(str(STORIES))
    tmp = out.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    dim, layers, heads, kv, hd, ffn, vocab = 256, 4, 8, 4, 32, 768, 512
    w.add_name("stories-vocab llama, random weights, 4k context")
    w.add_block_count(layers)
    w.add_context_length(4096)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(1e-5)
    for name, f in r.fields.items():
        if not name.startswith("tokenizer."):
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            sub = f.types[1]
            if sub == gguf.GGUFValueType.STRING:
                val = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            else:
                val = [f.parts[i].tolist()[0] for i in f.data]
            w.add_key_value(name, val, t, sub_type=sub)
        elif t == gguf.GGUFValueType.STRING:
            w.add_key_value(name, bytes(f.parts[f.data[0]]).decode("utf-8"), t)
        else:
            w.add_key_value(name, f.parts[f.data[0]].tolist()[0], t)
    rng = np.random.default_rng(36)

    def mat(rows, cols):
        return rng.normal(0, 0.05, (rows, cols)).astype(np.float32)
    ones = np.ones(dim, dtype=np.float32)
    w.add_tensor("token_embd.weight", mat(vocab, dim))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", mat(vocab, dim))
    for il in range(layers):
        b = f"blk.{il}."
        w.add_tensor(b + "attn_norm.weight", ones)
        w.add_tensor(b + "attn_q.weight", mat(heads * hd, dim))
        w.add_tensor(b + "attn_k.weight", mat(kv * hd, dim))
        w.add_tensor(b + "attn_v.weight", mat(kv * hd, dim))
        w.add_tensor(b + "attn_output.weight", mat(dim, heads * hd))
        w.add_tensor(b + "ffn_norm.weight", ones)
        w.add_tensor(b + "ffn_gate.weight", mat(ffn, dim))
        w.add_tensor(b + "ffn_up.weight", mat(ffn, dim))
        w.add_tensor(b + "ffn_down.weight", mat(dim, ffn))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.rename(out)
    return out


def metric_sum(replicas, name):
    total = 0.0
    for r in replicas:
        try:
            text = requests.get(r.url("/metrics"), timeout=10).text
        except requests.RequestException:
            continue  # (a killed replica: its counters went with it)
        for line in text.splitlines():
            if line.startswith(f"pagoda:{name}{{") or line.startswith(f"pagoda:{name} "):
                total += float(line.split()[-1])
    return total


def start_router(router_bin, policy, urls, log):
    port = free_port()
    # retries, fast health checks and a short circuit-breaker timeout, as the README deploys it
    # (the breaker, 60 s by default, keeps a restarted replica out after the failures its
    # shutdown caused)
    p = subprocess.Popen(
        [router_bin, "launch", "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
         "--worker-urls", *urls, "--retry-max-retries", "5", "--retry-initial-backoff-ms", "50",
         "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
         "--health-success-threshold", "1", "--cb-timeout-duration-secs", "5",
         "--log-level", "info",
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())],
        stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            if requests.get(base + "/v1/models", timeout=5).json()["data"]:
                return p, base
        except (requests.RequestException, ValueError, KeyError):
            pass
        if p.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"sglang-router did not start (log: {log.name})")
        time.sleep(0.2)


def healthy_workers(base):
    """The workers the router routes to: its /workers list where it has one, else /get_loads."""
    try:
        d = requests.get(base + "/workers", timeout=5).json()
        ws = d.get("workers", d) if isinstance(d, dict) else d
        return {w["url"] for w in ws if w.get("is_healthy", True)}
    except (requests.RequestException, ValueError, KeyError, TypeError, AttributeError):
        return None


def one_request(base, model, prompt, max_tokens, stream):
    """(ok, cut, ttft_s, completion_tokens)"""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    t0 = time.perf_counter()
    if not stream:
        try:
            r = requests.post(base + "/v1/completions", json=body, timeout=300)
        except requests.RequestException:
            return False, False, None, 0
        ok = r.status_code == 200
        return ok, False, time.perf_counter() - t0 if ok else None, \
            r.json()["usage"]["completion_tokens"] if ok else 0
    ttft, n, done = None, 0, False
    try:
        with requests.post(base + "/v1/completions", json=dict(body, stream=True,
                           stream_options={"include_usage": True}), stream=True,
                           timeout=300) as r:
            if r.status_code != 200:
                return False, False, None, 0
            for line in r.iter_lines():
                if not line.startswith(b"data: "):
                    continue
                if line == b"data: [DONE]":
                    done = True
                    break
                ev = json.loads(line[6:])
                if ttft is None and ev.get("choices"):
                    ttft = time.perf_counter() - t0
                if ev.get("usage"):
                    n = ev["usage"]["completion_tokens"]
    except (requests.RequestException, ValueError):
        pass
    if done:
        return True, False, ttft, n
    return False, ttft is not None, ttft, n  # cut: it had started


def run(a, policy, model_path, log_dir, rnd):
    args = ["--kv-cache-memory", a.kv_cache_memory, "--drain-timeout", "30"]
    replicas = [Server(model_path, *args, binary=a.pagoda, threads=a.threads).start()
                for _ in range(a.replicas)]
    log = open(log_dir / f"router-{policy}-{rnd}.log", "w")
    router, base = start_router(a.router, policy, [r.url() for r in replicas], log)
    model = requests.get(base + "/v1/models", timeout=10).json()["data"][0]["id"]
    rng = random.Random(a.seed + rnd)
    tenants = [" ".join(rng.choice(WORDS) for _ in range(a.prefix_words)) for _ in
               range(a.tenants)]
    jobs = [(t, f"{tenants[t]}\nQuestion {q}: " + " ".join(rng.choice(WORDS) for _ in
                                                            range(rng.randint(3, 12))))
            for t in range(a.tenants) for q in range(a.questions)]
    rng.shuffle(jobs)
    streamed = [rng.random() >= a.nonstream_fraction for _ in jobs]
    results = [None] * len(jobs)
    lock = threading.Lock()
    nxt = [0]
    fault_at = int(len(jobs) * 0.4)
    fault = {"t": None, "left_s": None, "rejoined_s": None}
    victim = replicas[-1]

    def do_fault():
        fault["t"] = time.time()
        if a.fault == "kill":
            victim.kill()
        else:
            victim.proc.send_signal(signal.SIGTERM)

    def worker():
        while True:
            with lock:
                i = nxt[0]
                if i >= len(jobs):
                    return
                nxt[0] += 1
                if a.fault != "none" and i == fault_at:
                    do_fault()
            results[i] = one_request(base, model, jobs[i][1], a.max_tokens, streamed[i])

    t0 = time.time()
    ts = [threading.Thread(target=worker) for _ in range(a.concurrency)]
    for t in ts:
        t.start()
    watcher_stop = threading.Event()

    def watch():  # when the faulted replica leaves the router's rotation
        while not watcher_stop.is_set():
            if fault["t"] is not None and fault["left_s"] is None:
                ws = healthy_workers(base)
                if ws is not None and victim.url() not in ws:
                    fault["left_s"] = time.time() - fault["t"]
            time.sleep(0.05)
    w = threading.Thread(target=watch)
    w.start()
    for t in ts:
        t.join()
    wall = time.time() - t0
    if a.fault != "none":
        deadline = time.time() + 15
        while fault["left_s"] is None and time.time() < deadline:
            time.sleep(0.1)
    watcher_stop.set()
    w.join()
    # fresh replicas: their counters are this run's (a faulted one's went with it)
    survivors = [r for r in replicas if r is not victim] if a.fault != "none" else replicas
    queries = metric_sum(survivors, "prefix_cache_queries_total")
    hits = metric_sum(survivors, "prefix_cache_hits_total")
    rejoin = None
    if a.fault != "none":  # a replica started again on the same address rejoins
        if a.fault == "term":
            victim.proc.wait(timeout=60)
        port = int(victim.url().rsplit(":", 1)[1].split("/")[0])
        again = Server(model_path, *args, "--port", str(port), binary=a.pagoda,
                       threads=a.threads).start()
        t_up = time.time()
        deadline = t_up + 30
        k = 0
        while time.time() < deadline:  # new prompts: cache_aware sends those to the emptiest
            k += 1
            one_request(base, model, f"{rng.choice(WORDS)} {k} {rng.choice(WORDS)}", 2, False)
            if any('"path":"/v1/completions"' in ln for ln in again.stderr().splitlines()):
                rejoin = time.time() - t_up
                break
            time.sleep(0.05)
        if rejoin is None:
            print("no request reached the restarted replica:", healthy_workers(base),
                  again.url(), again.stderr()[-800:], file=sys.stderr)
        replicas.append(again)
    ok = [r for r in results if r and r[0]]
    ttfts = sorted(r[2] for r in ok if r[2] is not None)
    ns_failed = sum(1 for r, s in zip(results, streamed) if not s and not r[0])
    st_failed = sum(1 for r, s in zip(results, streamed) if s and not r[0])
    cut = sum(1 for r, s in zip(results, streamed) if s and r[1])
    out = {
        "policy": policy, "round": rnd, "requests": len(jobs),
        "streamed": sum(streamed), "nonstreamed": len(jobs) - sum(streamed),
        "hit_rate": hits / queries if queries else 0.0,
        "ttft_p50_ms": 1000 * statistics.median(ttfts) if ttfts else None,
        "ttft_p90_ms": 1000 * ttfts[int(0.9 * (len(ttfts) - 1))] if ttfts else None,
        "output_tok_s": sum(r[3] for r in ok) / wall, "wall_s": wall,
        "nonstream_failed": ns_failed, "stream_failed": st_failed, "streams_cut": cut,
        "fault": a.fault, "left_rotation_s": fault["left_s"], "rejoined_s": rejoin,
    }
    router.terminate()
    router.wait(timeout=30)
    log.close()
    for r in replicas:
        if r.proc.poll() is None:
            r.stop(check=False)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pagoda", default=str(ROOT / "build" / "pagoda"))
    ap.add_argument("--router", default=str(Path(sys.executable).parent / "sglang-router"))
    ap.add_argument("--workdir", default="/tmp/pagoda-scale-out")
    ap.add_argument("--policies", default="cache_aware,round_robin")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--prefix-words", type=int, default=700)
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--kv-cache-memory", default="8MiB")  # F16 KV: ~3 prompts
    ap.add_argument("--nonstream-fraction", type=float, default=0.0)
    ap.add_argument("--fault", choices=["none", "kill", "term"], default="none")
    ap.add_argument("--seed", type=int, default=36)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    model = make_model(work / "stories-vocab-4k.gguf")
    rows = []
    for rnd in range(a.rounds):
        for policy in a.policies.split(","):
            row = run(a, policy, model, work, rnd)
            rows.append(row)
            if not a.json:
                print(json.dumps(row), flush=True)
    if a.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
