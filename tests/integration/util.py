"""Helpers shared by the integration tests: where things are and how to run the binary."""
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
BUILD = Path(os.environ.get("PAGODA_BUILD", ROOT / "build"))
PAGODA = Path(os.environ.get("PAGODA_BIN", BUILD / "pagoda"))
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE = Path(os.environ.get("PAGODA_CACHE", Path.home() / ".cache" / "pagoda"))


def run_pagoda(*args, input=None, check=True, timeout=600, env=None):
    """Runs the pagoda binary; returns the CompletedProcess (stdout/stderr as bytes)."""
    cmd = [str(PAGODA)] + [str(a) for a in args]
    p = subprocess.run(cmd, input=input, capture_output=True, timeout=timeout, env=env)
    if check and p.returncode != 0:
        raise AssertionError(f"{cmd} exited {p.returncode}: {p.stderr.decode(errors='replace')}")
    return p


def model_with_template(tmp_path_factory, template, model=None):
    """A copy of model (default: the tiny random Llama, 32k vocabulary) carrying the chat
    template tests/data/chat-templates/<template>, set by gguf-new-metadata (the gguf package);
    the test is skipped without it."""
    import subprocess
    import sys

    import pytest
    tool = Path(sys.executable).with_name("gguf-new-metadata")
    if not tool.exists():
        pytest.skip("gguf-new-metadata (the gguf package) is not installed")
    out = tmp_path_factory.mktemp("tmpl") / "model-with-template.gguf"
    subprocess.run([str(tool), str(model or DATA / "models" / "llama-2-tiny-random.gguf"),
                    str(out), "--chat-template-file", str(DATA / "chat-templates" / template)],
                   check=True, capture_output=True)
    return out


def post(server, path, body, **kw):
    """POST body as JSON to a test server (server_util.Server)."""
    import requests
    return requests.post(server.url(path), json=body, timeout=300, **kw)


def check_sampled_constrained(server, constraint, status, min_stops):
    """The random-weight model's sampled answers (n=8, three seeds) under constraint (request
    keys): each is status(text) == "match" when it stops and a "prefix" (or a match) when
    max_tokens cuts it, and the same requests without the constraint never match. Asserts at
    least min_stops stopped answers, so both cases are seen."""
    from server_util import validate
    base = {"prompt": "Hello", "max_tokens": 12, "n": 8, "temperature": 1.0}
    n_stop = 0
    for seed in range(3):
        r = post(server, "/v1/completions", dict(base, seed=seed, **constraint))
        assert r.status_code == 200, r.text
        validate(r.json(), "CreateCompletionResponse")
        for c in r.json()["choices"]:
            want = "match" if c["finish_reason"] == "stop" else "prefix"
            assert status(c["text"]) in (want, "match"), c
            n_stop += c["finish_reason"] == "stop"
        free = post(server, "/v1/completions", dict(base, seed=seed)).json()
        assert not any(status(c["text"]) == "match" for c in free["choices"])
    assert n_stop >= min_stops, n_stop


def mutated_texts(samples, seed, extra=""):
    """Texts that tell a recognizer's states apart: the samples, all their prefixes, each
    character replaced, dropped or preceded by another, and 300 random strings of up to 12
    characters over the samples' alphabet, a few more characters and extra."""
    import random
    rng = random.Random(seed)
    alphabet = sorted(set("".join(samples)) | set("a0-. \né中x" + extra))
    out = set(samples)
    for s in samples:
        out.update(s[:i] for i in range(len(s) + 1))
        for i in range(len(s)):
            out.add(s[:i] + rng.choice(alphabet) + s[i + 1:])
            out.add(s[:i] + s[i + 1:])
            out.add(s[:i] + rng.choice(alphabet) + s[i:])
    for _ in range(300):
        out.add("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))))
    return sorted(out)
