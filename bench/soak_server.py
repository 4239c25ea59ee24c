"""Server soak: many requests of mixed shapes against one `pagoda serve`, with a third of the
streams dropped mid-way, printing the server's RSS as it goes. A leak shows as RSS that keeps
growing after the KV pool has been touched (the pool is allocated once and touched lazily, so
RSS first climbs to about --kv-cache-memory and should then stay flat).

    python3 bench/soak_server.py [--requests N] [--clients C] [--model M] [--binary B]

Not a test (it takes minutes and its figure is a trend): results go to bench/RESULTS.md."""
import argparse
import http.client
import json
import random
import socket
import subprocess
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ap = argparse.ArgumentParser()
ap.add_argument("--requests", type=int, default=24000)
ap.add_argument("--clients", type=int, default=8)
ap.add_argument("--model", default=str(ROOT / "tests/data/models/stories260K.gguf"))
ap.add_argument("--binary", default=str(ROOT / "build/pagoda"))
ap.add_argument("--port", type=int, default=18777)
args = ap.parse_args()

srv = subprocess.Popen([args.binary, "serve", "-m", args.model, "--port", str(args.port),
                        "-t", "1", "--no-log-requests"], stderr=subprocess.DEVNULL)


def rss_kib():
    for line in open(f"/proc/{srv.pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])


def ready():
    try:
        c = http.client.HTTPConnection("127.0.0.1", args.port, timeout=5)
        c.request("GET", "/health")
        return c.getresponse().status == 200
    except OSError:
        return False


while not ready():
    time.sleep(0.2)
BODIES = [
    {"prompt": "Once upon a time", "max_tokens": 32},
    {"prompt": "Once upon a time", "max_tokens": 32, "stream": True},
    {"prompt": "The little dog", "max_tokens": 16, "n": 2, "temperature": 0.8, "logprobs": 3},
    {"prompt": ["a", "b", "Lily went"], "max_tokens": 8, "echo": True},
    {"prompt": "x" * 300, "max_tokens": 4, "stop": ["the", "."]},
]
errors, done = [], [0]


def one(i):
    b = dict(random.Random(i).choice(BODIES), seed=i)
    data = json.dumps(b).encode()
    if b.get("stream") and i % 3 == 0:  # a client that drops the stream after its first bytes
        s = socket.create_connection(("127.0.0.1", args.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
        s.recv(200)
        s.close()
        return
    c = http.client.HTTPConnection("127.0.0.1", args.port, timeout=60)
    c.request("POST", "/v1/completions", data, {"Content-Type": "application/json"})
    r = c.getresponse()
    body = r.read()
    if r.status != 200:
        errors.append((r.status, body[:200]))


def client(k):
    for i in range(args.requests // args.clients):
        try:
            one(k * 10_000_000 + i)
        except OSError as e:
            errors.append(repr(e))
        done[0] += 1


t0 = time.time()
print(json.dumps({"t_s": 0, "requests": 0, "rss_kib": rss_kib()}), flush=True)
threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
for t in threads:
    t.start()
while any(t.is_alive() for t in threads):
    time.sleep(3)
    print(json.dumps({"t_s": round(time.time() - t0, 1), "requests": done[0],
                      "rss_kib": rss_kib(), "errors": len(errors)}), flush=True)
srv.terminate()
print(json.dumps({"done": done[0], "errors": len(errors), "first_errors": errors[:3],
                  "server_exit": srv.wait()}), flush=True)
