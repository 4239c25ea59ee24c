"""Three replicas behind sglang-router (issue 36), through bench/scale_out.py run small: each
run gets fresh replicas and its own router on 127.0.0.1, a random 4k-context Llama with
stories260K's tokenizer, 8 tenants whose system prompts are 1,212 tokens, a KV pool of 8 MiB
per replica (F16 KV, the default: about three of those prompts).

- cache_aware against round_robin in the same run: cache-aware routing keeps each tenant's
  prefix on one replica, so its prefix-cache hit rate is higher and its TTFT p50 lower (the
  prefill of 1,200 tokens against a few cached steps: a large effect, not a close timing);
- SIGKILL one replica while requests run: no non-streamed request fails (the router retries
  them elsewhere); the streams the kill cut are counted and printed; the router takes the dead
  replica out of rotation within seconds (its /workers is_healthy) and a replica started again
  on the same address serves again;
- SIGTERM one replica while requests run: it drains (in-flight requests finish, new ones are
  refused with 503 and the listening socket closes), the router moves traffic, zero errors.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import util

ROOT = Path(__file__).resolve().parents[2]
ROUTER = Path(sys.executable).parent / "sglang-router"


def scale_out(tmp_path, *args):
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "scale_out.py"), "--pagoda", str(util.PAGODA),
         "--router", str(ROUTER), "--workdir", str(tmp_path), "--rounds", "1", "--tenants", "8",
         "--prefix-words", "700", "--json", *args],
        capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(p.stdout)
    print(json.dumps(rows, indent=1))
    return rows


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("scale")  # (the model is written once, then reused)


def test_cache_aware_beats_round_robin(workdir):
    rows = scale_out(workdir, "--policies", "cache_aware,round_robin", "--questions", "5",
                     "--concurrency", "8")
    ca, rr = rows
    for r in rows:
        assert r["requests"] == 40 and r["stream_failed"] == 0 and r["nonstream_failed"] == 0, r
    assert ca["hit_rate"] > rr["hit_rate"] + 0.1, (ca, rr)
    assert ca["ttft_p50_ms"] < rr["ttft_p50_ms"], (ca, rr)


@pytest.mark.parametrize("fault", ["kill", "term"])
def test_a_replica_fails_mid_run(workdir, fault):
    (r,) = scale_out(workdir, "--policies", "round_robin", "--questions", "6", "--concurrency",
                     "6", "--max-tokens", "48", "--nonstream-fraction", "0.5", "--fault", fault)
    assert r["nonstream_failed"] == 0, r  # retried on another replica
    if fault == "term":  # drained: nothing is lost, streamed or not
        assert r["stream_failed"] == 0 and r["streams_cut"] == 0, r
    assert r["left_rotation_s"] is not None and r["left_rotation_s"] < 5, r
    assert r["rejoined_s"] is not None and r["rejoined_s"] < 15, r
