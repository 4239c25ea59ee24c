"""KV events for KV-aware routers (issue 36), in vLLM's wire format.

A subscriber written from vLLM's published event classes (vllm/distributed/kv_events.py: the
msgspec structs below, array-like and tagged, decoded strictly) follows `pagoda serve
--kv-events-config` over ZMQ (PUB for the live stream, ROUTER for replay) through a random
workload on a small KV pool: shared prefixes, evictions, preemption, aborted streams, two LoRA
adapters and /flush_cache. It rebuilds the set of cached blocks (hash -> tokens, adapter) from
the events alone and must find exactly the set the engine reports at /debug/kv_cache, at the
sequence number that dump names; every parent is announced before its child, every removal
names a block that was stored. A subscriber that joins late rebuilds the same set by replay, and
a replay buffer of buffer_steps batches holds the last ones only, then the end marker. The
main subscriber ignores every tenth live message and recovers it by replay; another ignores
every live message and keeps up by replay alone.
"""
import json
import random
import subprocess
import threading
import time

import msgspec
import numpy as np
import pytest
import requests
import zmq
from safetensors.numpy import save_file

import util
from server_util import Server
from test_sglang_router import free_port

STORIES = util.DATA / "models" / "stories260K.gguf"
BLOCK = 16


# --- vLLM's event classes (vllm/distributed/kv_events.py), as its subscriber example has them --
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base class for all KV cache-related events"""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


class Subscriber:
    """Follows the PUB socket; a gap in the sequence numbers is filled from the replay socket
    (vLLM's protocol: send the first missing sequence number, receive (seq, payload) pairs up to
    the end marker -1). Rebuilds {block_hash: (tokens, lora_name, lora_id)}. With drop_every,
    it ignores every drop_every-th live message, as a slow subscriber loses them at the
    high-water mark, and must recover each one by replay."""

    def __init__(self, pub, replay, drop_every=0):
        self.drop_every = drop_every
        self.n_live = 0
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(pub)
        self.rep = self.ctx.socket(zmq.DEALER)
        self.rep.connect(replay)
        self.dec = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.lock = threading.Lock()
        self.next = 0
        self.blocks = {}
        self.ever = set()
        self.errors = []
        self.counts = {"stored": 0, "removed": 0, "cleared": 0, "replays": 0}
        self.lora_names = set()
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def apply(self, seq, payload):
        if seq < self.next:
            return  # (a replayed batch already applied)
        if seq != self.next:
            self.errors.append(f"batch {self.next} missing (next is {seq})")
        batch = self.dec.decode(payload)
        assert batch.data_parallel_rank == 0
        for ev in batch.events:
            if isinstance(ev, AllBlocksCleared):
                self.blocks.clear()
                self.counts["cleared"] += 1
            elif isinstance(ev, BlockRemoved):
                assert ev.medium == "CPU", ev
                for h in ev.block_hashes:
                    if h not in self.blocks:
                        self.errors.append(f"batch {seq}: {h} removed but not stored")
                    self.blocks.pop(h, None)
                    self.counts["removed"] += 1
            else:
                assert ev.medium == "CPU" and ev.block_size == BLOCK, ev
                assert len(ev.token_ids) == BLOCK * len(ev.block_hashes), ev
                parent = ev.parent_block_hash
                for i, h in enumerate(ev.block_hashes):
                    if parent is not None and parent not in self.ever:
                        self.errors.append(f"batch {seq}: {h}'s parent {parent} never announced")
                    if h in self.blocks:
                        self.errors.append(f"batch {seq}: {h} stored twice")
                    toks = tuple(ev.token_ids[i * BLOCK:(i + 1) * BLOCK])
                    self.blocks[h] = (toks, ev.lora_name, ev.lora_id)
                    self.ever.add(h)
                    parent = h
                    self.counts["stored"] += 1
                if ev.lora_name:
                    self.lora_names.add(ev.lora_name)
        self.next = seq + 1

    def replay_from(self, start):
        self.counts["replays"] += 1
        self.rep.send_multipart([b"", start.to_bytes(8, "big")])
        while True:
            if not self.rep.poll(10000):
                self.errors.append(f"replay from {start}: no end marker")
                return
            frames = self.rep.recv_multipart()
            assert len(frames) == 3 and frames[0] == b"", frames
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq == -1:
                assert frames[2] == b""
                return
            self.apply(seq, frames[2])

    def run(self):
        try:
            with self.lock:
                self.replay_from(0)  # what was published before this subscriber joined
            while not self.stop:
                if not self.sub.poll(100):
                    continue
                topic, seqb, payload = self.sub.recv_multipart()
                assert topic == b"" and len(seqb) == 8
                self.n_live += 1
                if self.drop_every and self.n_live % self.drop_every == 0:
                    continue
                seq = int.from_bytes(seqb, "big")
                with self.lock:
                    if seq > self.next:
                        self.replay_from(self.next)
                    self.apply(seq, payload)
        except Exception as e:  # reported by the test
            self.errors.append(repr(e))

    def wait_for(self, seq, timeout=20):
        """Until batch seq is applied. A lost batch is seen as a gap only when a later one
        arrives; the last one before a quiet spell (here: the one the dump names) is asked for
        by replay once it is late, as a subscriber that knows the sequence number it expects."""
        deadline = time.time() + timeout
        asked = time.time() + 1
        while time.time() < deadline:
            with self.lock:
                if self.next > seq:
                    return
                if time.time() > asked:
                    self.replay_from(self.next)
                    asked = time.time() + 1
            time.sleep(0.05)
        raise AssertionError(f"subscriber at {self.next}, wanted past {seq}: {self.errors}")

    def state(self):
        with self.lock:
            return dict(self.blocks)

    def close(self):
        self.stop = True
        self.thread.join(timeout=10)
        self.ctx.destroy(linger=0)


def make_adapter(path, seed):
    """A PEFT LoRA adapter of stories260K's q_proj and v_proj (dim 64, 4 KV heads of 8: v is
    32 wide), random, as PEFT writes one (adapter_config.json, adapter_model.safetensors)."""
    rng = np.random.default_rng(seed)
    r = 4
    t = {}
    for i in range(5):
        pre = f"base_model.model.model.layers.{i}.self_attn"
        for name, out in (("q_proj", 64), ("v_proj", 32)):
            t[f"{pre}.{name}.lora_A.weight"] = rng.normal(0, 0.1, (r, 64)).astype(np.float32)
            t[f"{pre}.{name}.lora_B.weight"] = rng.normal(0, 0.1, (out, r)).astype(np.float32)
    path.mkdir()
    save_file(t, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": r, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"],
        "bias": "none", "task_type": "CAUSAL_LM"}))
    return path


def kv_config(pub_port, replay_port, **extra):
    return json.dumps(dict({"enable_kv_cache_events": True, "publisher": "zmq",
                            "endpoint": f"tcp://*:{pub_port}",
                            "replay_endpoint": f"tcp://*:{replay_port}", "topic": ""}, **extra))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("kvev")
    a, b = make_adapter(root / "a", 1), make_adapter(root / "b", 2)
    pub, rep = free_port(), free_port()
    # 512 KiB of F16 KV (the default) is about 51 blocks of 16 tokens: four sequences of up to
    # 280 tokens evict and preempt; and the disk tier (issue 38): blocks evicted or flushed come
    # back from disk, registered again, which must show as BlockStored events like any other
    # registration
    s = Server(STORIES, "--kv-events-config", kv_config(pub, rep), "--kv-cache-memory", "512KiB",
               "--max-loras", "2", "--lora-modules", f"a={a},b={b}", "--kv-cache-dir",
               root / "kv-disk", threads=1).start()
    yield s, f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{rep}"
    s.stop()


WORDS = ("the cat sat on a mat and the dog ran to the park where Lily played with her red ball "
         "under a big tree near the river").split()


def workload(server, rng, n=60, conc=4):
    docs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(60, 160))) for _ in range(3)]
    jobs = []
    for i in range(n):
        jobs.append(dict(prompt=rng.choice(docs) + " " + " ".join(rng.choice(WORDS) for _ in
                                                                  range(rng.randint(1, 40))),
                         model=rng.choice([None, None, "a", "b"]),
                         max_tokens=rng.randint(1, 24), cut=rng.random() < 0.2,
                         flush=i % 15 == 14, seed=rng.randint(0, 1 << 30)))
    errors = []

    def one(j):
        body = {"prompt": j["prompt"], "max_tokens": j["max_tokens"], "temperature": 0.8,
                "seed": j["seed"]}
        if j["model"]:
            body["model"] = j["model"]
        if j["cut"]:  # a stream the client drops after its first chunk: the engine aborts it
            with requests.post(server.url("/v1/completions"), json=dict(body, stream=True),
                               stream=True, timeout=120) as r:
                if r.status_code != 200:
                    errors.append(r.text)
                next(r.iter_lines(), None)
        else:
            r = requests.post(server.url("/v1/completions"), json=body, timeout=120)
            if r.status_code != 200:
                errors.append(r.text)
        if j["flush"]:
            r = requests.post(server.url("/flush_cache"), timeout=30)
            if r.status_code != 200:
                errors.append(r.text)

    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                if not jobs:
                    return
                j = jobs.pop()
            one(j)

    ts = [threading.Thread(target=worker) for _ in range(conc)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[:3]


def dump(server):
    r = requests.get(server.url("/debug/kv_cache"), timeout=60)
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["block_size"] == BLOCK
    return d, {b["block_hash"]: (tuple(b["token_ids"]), b["lora_name"], b["lora_id"])
               for b in d["blocks"]}


def settle(server):
    """No request running or waiting: the cache is what the last step left."""
    deadline = time.time() + 60
    while time.time() < deadline:
        load = requests.get(server.url("/get_load"), timeout=10).json()[0]
        if load["num_reqs"] == 0:
            return
        time.sleep(0.1)
    raise AssertionError("requests still running")


def test_events_rebuild_the_cache(served):
    server, pub, rep = served
    sub = Subscriber(pub, rep, drop_every=10)
    deaf = Subscriber(pub, rep, drop_every=1)  # loses every live batch: replay alone
    try:
        rng = random.Random(36)
        for rnd in range(3):
            workload(server, rng)
            settle(server)
            d, engine = dump(server)
            sub.wait_for(d["seq"])
            state = sub.state()
            assert not sub.errors, sub.errors[:5]
            assert state == engine, (rnd, len(state), len(engine),
                                     set(state) ^ set(engine))
            deaf.wait_for(d["seq"])
            assert not deaf.errors and deaf.state() == engine, deaf.errors[:5]
        assert sub.counts["stored"] > 100 and sub.counts["removed"] > 20, sub.counts
        assert sub.counts["replays"] > 10, sub.counts  # the dropped ones came back by replay
        assert sub.counts["cleared"] == 1, sub.counts  # sequence 0: the cache starts empty
        assert sub.lora_names == {"a", "b"}, sub.lora_names
        assert {v[1] for v in engine.values()} <= {None, "a", "b"}

        # a subscriber that joins now rebuilds the same set from the replay buffer alone
        late = Subscriber(pub, rep)
        try:
            late.wait_for(d["seq"])
            assert not late.errors, late.errors[:5]
            assert late.state() == engine
        finally:
            late.close()

        m = requests.get(server.url("/metrics"), timeout=10).text
        published = [ln for ln in m.splitlines() if ln.startswith("pagoda:kv_events_published")]
        assert published and float(published[0].split()[-1]) == d["seq"] + 1, published
        hits = [ln for ln in m.splitlines() if ln.startswith("pagoda:kv_disk_hits_total")]
        assert hits and float(hits[0].split()[-1]) > 0, hits
    finally:
        sub.close()
        deaf.close()


def test_replay_buffer_is_bounded(tmp_path):
    pub, rep = free_port(), free_port()
    s = Server(STORIES, "--kv-events-config", kv_config(pub, rep, buffer_steps=4),
               threads=1).start()
    try:
        for i in range(6):  # distinct prompts: each step stores new blocks, one batch each
            r = requests.post(s.url("/v1/completions"), json={
                "prompt": " ".join(WORDS[i:] + WORDS[:i]) * 2, "max_tokens": 2}, timeout=60)
            assert r.status_code == 200, r.text
        settle(s)
        last = requests.get(s.url("/debug/kv_cache"), timeout=30).json()["seq"]
        assert last >= 6
        ctx = zmq.Context()
        try:
            d = ctx.socket(zmq.DEALER)
            d.connect(f"tcp://127.0.0.1:{rep}")
            d.send_multipart([b"", (0).to_bytes(8, "big")])
            seqs = []
            while True:
                assert d.poll(10000), "no end marker"
                f = d.recv_multipart()
                seq = int.from_bytes(f[1], "big", signed=True)
                if seq == -1:
                    assert f[2] == b""
                    break
                msgspec.msgpack.decode(f[2], type=KVEventBatch)
                seqs.append(seq)
            assert seqs == list(range(last - 3, last + 1)), (seqs, last)
        finally:
            ctx.destroy(linger=0)
    finally:
        s.stop()


@pytest.mark.parametrize("cfg, words", [
    ('{"enable_kv_cache_events": true, "publisher": "kafka"}', "unknown publisher"),
    ('{"enable_kv_cache_events": true, "buffer_step": 4}', 'unknown field "buffer_step"'),
    ('{"enable_kv_cache_events": true, "buffer_steps": 0}', '"buffer_steps"'),
    ('[1]', "not a JSON object"),
])
def test_bad_config_is_one_line(cfg, words):
    p = subprocess.run([str(util.PAGODA), "serve", "-m", str(STORIES), "--port",
                        str(free_port()), "--kv-events-config", cfg],
                       capture_output=True, timeout=120)
    err = p.stderr.decode()
    assert p.returncode != 0, err
    line = [ln for ln in err.splitlines() if "kv-events-config" in ln]
    assert len(line) == 1 and words in line[0], err
