"""The prefix cache's disk tier (--kv-cache-dir, issue 38), against the same server without it.

- For every KV type (f32, f16, bf16, q8_0, q4_0; SmolLM2, whose heads of 64 take the quantized
  types), with a RAM pool of 9 blocks: a prompt evicted from RAM by another comes back from
  disk, and the answers, greedy and seeded, are the answers of a server with no disk tier;
  the disk-hit counters moved and the prompt's tokens were served from cache.
- A restart between two turns of a conversation gives the tokens of no restart, and the first
  request after the restart reads the disk.
- Fault injection: kill -9 while blocks are being written, then damage (a flipped byte in the
  first block of two prompts, a truncated entry, a torn temporary file), restart: no wrong
  answer, every damaged entry counted in /metrics and deleted; a restart with another KV type
  on the same directory drops every entry as foreign. Also under AddressSanitizer.
- A directory that cannot be written, and a bound too small for one block, degrade to
  recompute with the same answers; a path that cannot be a directory is a one-line error.
"""
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

sys.path.insert(0, str(Path(__file__).parent))
import util  # noqa: E402
from server_util import Server  # noqa: E402

MODEL = util.DEFAULT_MODEL
BLOCK = 16
# SmolLM2-135M: 30 layers, 3 KV heads of 64; bytes per token of K plus V, by type
PER_TOKEN = {"f32": 46080, "f16": 23040, "bf16": 23040, "q8_0": 12240, "q4_0": 6480}
ASAN_BUILD = os.environ.get("PAGODA_ASAN_BUILD")
ASAN_ENV = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:halt_on_error=1",
            "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
P = "pagoda:"

pytestmark = pytest.mark.skipif(not MODEL.exists(), reason="the default model is missing")


def pool(kv, blocks):
    return ["--kv-cache-memory", str(PER_TOKEN[kv] * BLOCK * blocks), "--kv-dtype", kv]


def prompt_ids(seed, n):
    r = random.Random(seed)
    return [r.randrange(100, 40000) for _ in range(n)]


A, B, C, D = (prompt_ids(s, 100) for s in (1, 2, 3, 4))


def complete(s, prompt, seeded=False, max_tokens=6):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if seeded:
        body.update(temperature=0.9, top_p=0.95, seed=1234)
    r = requests.post(s.url("/v1/completions"), json=body, timeout=300)
    assert r.status_code == 200, r.text
    j = r.json()
    return j["choices"][0]["text"], j["usage"]["prompt_tokens_details"]["cached_tokens"]


def disk(s, name):
    return s.metrics().get(P + "kv_disk_" + name, 0)


def wait_written(s, blocks):
    """Waits until the disk tier holds at least `blocks` blocks (writes are behind)."""
    m = s.wait_metrics(lambda m: m.get(P + "kv_disk_blocks", 0) >= blocks, timeout=60)
    assert m[P + "kv_disk_blocks"] >= blocks, m


def workload(s, on_disk=False):
    """A, then B and C evict A from the 9-block pool (7 blocks each with their answers), then
    A again (from disk when there is one), seeded and greedy. Answers and A's cached tokens."""
    out = [complete(s, A)[0]]
    if on_disk:
        wait_written(s, 6)  # (A's 6 full blocks; writes are behind)
    out += [complete(s, B)[0], complete(s, C)[0]]
    out.append(complete(s, A, seeded=True))
    out.append(complete(s, A))
    return out


@pytest.mark.parametrize("kv", ["f32", "f16", "bf16", "q8_0", "q4_0"])
def test_same_answers_with_blocks_from_disk(kv, tmp_path):
    with Server(MODEL, *pool(kv, 9)) as ref:
        want = workload(ref)
    with Server(MODEL, *pool(kv, 9), "--kv-cache-dir", tmp_path / "kv") as s:
        got = workload(s, True)
        m = s.metrics()
    assert [g if isinstance(g, str) else g[0] for g in got] == \
        [w if isinstance(w, str) else w[0] for w in want], (kv, got, want)
    # without the disk tier, A came back with nothing cached: it had left the pool
    assert want[3][1] == 0, want
    # with it, A's 6 full blocks (the last token's block excluded) came from disk, then from RAM
    assert got[3][1] == 96 and got[4][1] == 96, got
    assert m[P + "kv_disk_hits_total"] >= 6, m
    assert m[P + "kv_disk_read_bytes_total"] > 0 and m[P + "kv_disk_written_bytes_total"] > 0, m
    assert m[P + "kv_disk_corrupt_total"] == 0 and m[P + "kv_disk_write_errors_total"] == 0, m
    assert len(list((tmp_path / "kv").glob("*.kvb"))) == m[P + "kv_disk_blocks"]


def chat(s, messages):
    r = requests.post(s.url("/v1/chat/completions"), timeout=300,
                      json={"messages": messages, "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    j = r.json()
    return (j["choices"][0]["message"]["content"],
            j["usage"]["prompt_tokens_details"]["cached_tokens"])


STORY = " ".join(f"Room {i} has {i % 7} chairs and a {['red', 'blue', 'green'][i % 3]} door."
                 for i in range(30))
TURN1 = [{"role": "user", "content": STORY + " Which room has the most chairs?"}]


def turn2(answer):
    return TURN1 + [{"role": "assistant", "content": answer},
                    {"role": "user", "content": "And which doors are red?"}]


def test_restart_between_turns(tmp_path):
    with Server(MODEL, *pool("f32", 64)) as ref:
        a1, _ = chat(ref, TURN1)
        a2, _ = chat(ref, turn2(a1))
    args = [*pool("f32", 64), "--kv-cache-dir", tmp_path / "kv"]
    with Server(MODEL, *args) as s:
        b1, _ = chat(s, TURN1)
    # (SIGTERM: the server writes what is still only in RAM before it exits)
    with Server(MODEL, *args) as s:
        assert s.metrics()[P + "kv_disk_blocks"] > 0
        b2, cached = chat(s, turn2(b1))
        m = s.metrics()
    assert (b1, b2) == (a1, a2)
    assert m[P + "kv_disk_hits_total"] > 0 and cached >= BLOCK * m[P + "kv_disk_hits_total"], \
        (cached, m)


def damage(d):
    """Flips a payload byte of the first block of A and of B, truncates another entry, leaves a
    torn temporary file. The flipped and truncated files, with their damaged bytes."""
    firsts, others = {}, []
    for f in sorted(d.glob("*.kvb")):
        if f.name.startswith(".tmp-"):
            continue
        b = f.read_bytes()
        toks = [int.from_bytes(b[64 + 4 * i:68 + 4 * i], "little", signed=True)
                for i in range(BLOCK)]
        for name, p in (("A", A), ("B", B)):
            if toks == p[:BLOCK]:
                firsts[name] = f
                break
        else:
            others.append(f)
    assert set(firsts) == {"A", "B"}, firsts
    for f in firsts.values():
        b = bytearray(f.read_bytes())
        b[-100] ^= 0x40
        f.write_bytes(bytes(b))
    os.truncate(others[0], 1000)
    (d / ".tmp-00000000deadbeef.kvb").write_bytes(b"torn")
    return {f: f.read_bytes() for f in list(firsts.values()) + [others[0]]}


def fault_injection(tmp_path, **kw):
    d = tmp_path / "kv"
    args = [*pool("f32", 40), "--max-num-seqs", "4"]
    with Server(MODEL, *args, **kw) as ref:
        want = [complete(ref, p) for p in (A, B, C, D)]
    # many writes in flight: four prompts at once (24 blocks staged by their first step),
    # killed as soon as the first block lands
    s = Server(MODEL, *args, "--kv-cache-dir", d, **kw).start()
    with ThreadPoolExecutor(4) as ex:
        futs = [ex.submit(complete, s, p, False, 64) for p in (A, B, C, D)]
        s.wait_metrics(lambda m: m.get(P + "kv_disk_blocks", 0) >= 1, timeout=120)
        s.proc.send_signal(signal.SIGKILL)
        s.proc.wait()
        for f in futs:
            try:
                f.result()
            except requests.RequestException:
                pass
    s.kill()
    s.stop(check=False)
    n_tmp = len(list(d.glob(".tmp-*")))
    # the killed run left complete entries only (and perhaps torn temporary files: counted,
    # deleted), the first block of the first prompt it admitted among them; this run reads it
    # back, and on SIGTERM writes every block the four prompts registered
    with Server(MODEL, *args, "--kv-cache-dir", d, **kw) as s:
        assert s.metrics()[P + "kv_disk_corrupt_total"] == n_tmp
        assert [complete(s, p)[0] for p in (A, B, C, D)] == [w[0] for w in want]
        assert s.metrics()[P + "kv_disk_hits_total"] >= 1
    bad = damage(d)
    with Server(MODEL, *args, "--kv-cache-dir", d, **kw) as s:
        m0 = s.metrics()
        assert m0[P + "kv_disk_corrupt_total"] == 2, m0  # the truncated entry, the torn file
        got = [complete(s, p) for p in (A, B, C, D)]
        m = s.metrics()
    assert [g[0] for g in got] == [w[0] for w in want]
    assert m[P + "kv_disk_corrupt_total"] == 4, m  # and the two flipped bytes, on load
    assert m[P + "kv_disk_hits_total"] >= 6, m  # C and D came from disk (but one truncated block)
    # each damaged file was deleted, and perhaps written again whole by the recompute
    assert not any(f.exists() and f.read_bytes() == b for f, b in bad.items())
    # another KV type on the same directory: every entry is foreign, dropped, never used
    n = len(list(d.glob("*.kvb")))
    f16 = [*pool("f16", 40), "--max-num-seqs", "4"]
    with Server(MODEL, *f16, **kw) as ref:
        want16 = complete(ref, C)
    with Server(MODEL, *f16, "--kv-cache-dir", d, **kw) as s:
        m = s.metrics()
        assert m[P + "kv_disk_corrupt_total"] == n and m[P + "kv_disk_blocks"] == 0, (n, m)
        assert complete(s, C) == want16


def test_kill_restart_and_damage(tmp_path):
    fault_injection(tmp_path)


@pytest.mark.skipif(not ASAN_BUILD, reason="PAGODA_ASAN_BUILD is not set")
def test_kill_restart_and_damage_asan(tmp_path):
    fault_injection(tmp_path, binary=Path(ASAN_BUILD) / "pagoda", env=ASAN_ENV, ready_timeout=300)


def unwritable_dir(tmp_path):
    """A directory the server cannot create files in: chmod for a user, /sys for root (whom
    permissions do not stop)."""
    if os.geteuid() != 0:
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o555)
        return d
    for d in ("/sys", "/proc"):
        try:
            os.close(os.open(os.path.join(d, ".tmp-probe.kvb"), os.O_CREAT | os.O_WRONLY))
        except OSError:
            return Path(d)
    pytest.skip("no unwritable directory for root")


@pytest.mark.parametrize("how", ["read-only", "too-small"])
def test_unwritable_or_full_disk_recomputes(how, tmp_path):
    extra = (["--kv-cache-dir", unwritable_dir(tmp_path)] if how == "read-only"
             else ["--kv-cache-dir", tmp_path / "kv", "--kv-cache-disk-size", "100K"])
    with Server(MODEL, *pool("f16", 9)) as ref:
        want = workload(ref)
    with Server(MODEL, *pool("f16", 9), *extra) as s:
        got = [complete(s, A)[0], complete(s, B)[0], complete(s, C)[0], complete(s, A, True),
               complete(s, A)]
        m = s.wait_metrics(lambda m: m[P + "kv_disk_write_errors_total"] +
                           m[P + "kv_disk_writes_dropped_total"] >= 18)
    assert got == want
    assert m[P + "kv_disk_hits_total"] == 0 and m[P + "kv_disk_blocks"] == 0, m
    key = "write_errors" if how == "read-only" else "writes_dropped"
    assert m[P + f"kv_disk_{key}_total"] >= 18, m


@pytest.mark.parametrize("where, words", [("/etc/hostname", "Not a directory"),
                                          ("/nonexistent/a/b", "No such file or directory")])
def test_bad_directory_is_one_line(where, words):
    p = subprocess.run([str(util.PAGODA), "serve", "-m", str(MODEL), "--port", "0",
                        "--kv-cache-dir", where], capture_output=True, timeout=120)
    err = p.stderr.decode()
    assert p.returncode != 0, err
    line = [ln for ln in err.splitlines() if "--kv-cache-dir" in ln]
    assert len(line) == 1 and words in line[0], err
