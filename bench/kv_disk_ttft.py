"""Time to first token of a long shared prefix: cold, warm in the RAM prefix cache, and warm
from the disk tier (--kv-cache-dir) after a restart (issue 38).

Each round takes a fresh prefix of --prefix random token ids (so nothing is cached from an
earlier round) and three different suffixes (so each request computes at least its last
block): request 1 is cold; request 2, on the same server, finds the prefix in RAM; then the
server is restarted on the same directory (SIGTERM: it writes what is still only in RAM) and
request 3 finds the prefix on disk alone. TTFT is the time to the first streamed chunk of a
two-token completion (two: a request that finishes on the step of its last prefill chunk does
not register that chunk's blocks, so the next request would recompute them). Medians over
--rounds rounds, all in the same run.

    python bench/kv_disk_ttft.py --pagoda build/pagoda --rounds 3 [--kv-dtype f16]
"""
import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]


class Server:
    def __init__(self, args):
        self.args = args

    def __enter__(self):
        self.log = tempfile.NamedTemporaryFile(prefix="pgd-bench-", suffix=".log", delete=False)
        self.p = subprocess.Popen(self.args + ["--port", "0"], stdout=subprocess.DEVNULL,
                                  stderr=self.log, cwd=ROOT)
        deadline = time.time() + 120
        self.port = None
        while self.port is None and time.time() < deadline:
            for line in Path(self.log.name).read_text(errors="replace").splitlines():
                if '"listening"' in line:
                    self.port = json.loads(line)["port"]
            time.sleep(0.05)
        while time.time() < deadline:
            try:
                if requests.get(self.url("/health"), timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise RuntimeError(Path(self.log.name).read_text())

    def __exit__(self, *exc):
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(timeout=300)
        os.unlink(self.log.name)

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def metrics(self):
        out = {}
        for line in requests.get(self.url("/metrics"), timeout=10).text.splitlines():
            if line.startswith("pagoda:kv_disk") or line.startswith("pagoda:prefix_cache"):
                name, value = line.rsplit(" ", 1)
                out[name.split("{")[0].split(":", 1)[1]] = float(value)
        return out


def ttft(s, prompt):
    t = time.perf_counter()
    with requests.post(s.url("/v1/completions"), stream=True, timeout=600,
                       json={"prompt": prompt, "max_tokens": 2, "temperature": 0,
                             "stream": True}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                return time.perf_counter() - t
    raise RuntimeError("no chunk")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", default=str(ROOT / "build" / "pagoda"))
    ap.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--prefix", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-dtype", default="f32")
    ap.add_argument("--dir", default=None, help="the disk tier's directory (default: a temp one)")
    a = ap.parse_args()
    d = Path(a.dir or tempfile.mkdtemp(prefix="pgd-kv-disk-"))
    args = [a.pagoda, "serve", "-m", a.model, "-t", str(a.threads), "--kv-dtype", a.kv_dtype,
            "--kv-cache-memory", "1GiB", "--kv-cache-dir", str(d), "--kv-cache-disk-size", "8GiB",
            "--max-num-batched-tokens", "512"]
    res = {"cold": [], "ram": [], "disk": []}
    hits = []
    for rnd in range(a.rounds):
        r = random.Random(1000 + rnd)
        prefix = [r.randrange(100, 40000) for _ in range(a.prefix)]
        sfx = [[r.randrange(100, 40000) for _ in range(8)] for _ in range(3)]
        with Server(args) as s:
            res["cold"].append(ttft(s, prefix + sfx[0]))
            res["ram"].append(ttft(s, prefix + sfx[1]))
        with Server(args) as s:
            m0 = s.metrics()
            res["disk"].append(ttft(s, prefix + sfx[2]))
            m1 = s.metrics()
            hits.append((m1["kv_disk_hits_total"] - m0.get("kv_disk_hits_total", 0),
                         m1["prefix_cache_hits_total"]))
        print(f"round {rnd}: cold {res['cold'][-1]:.3f}s ram {res['ram'][-1]:.3f}s "
              f"disk {res['disk'][-1]:.3f}s (disk blocks read {hits[-1][0]:.0f}, prompt tokens "
              f"from cache {hits[-1][1]:.0f})", flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"\nprefix {a.prefix} tokens, KV {a.kv_dtype}, -t {a.threads}, medians of {a.rounds}")
    print("| case | TTFT (s) | vs cold |")
    print("| --- | --- | --- |")
    for k, name in (("cold", "cold"), ("ram", "warm in RAM"), ("disk", "warm from disk, after "
                                                               "a restart")):
        print(f"| {name} | {med[k]:.3f} | {med['cold'] / med[k]:.1f}x faster |")
    if not a.dir:
        shutil.rmtree(d)


if __name__ == "__main__":
    main()
