"""GET /v1/kv_plan answers with the same arithmetic as `pagoda kv-plan` for the server's own model
and KV budget; server options for speculation and the backend are accepted and take effect."""
import json

import requests

from server_util import Server
from util import DATA, run_pagoda

STORIES = DATA / "models" / "stories260K.gguf"


def test_kv_plan_endpoint_matches_cli():
    # the server's KV type is --kv-dtype's default, F16
    cli = json.loads(run_pagoda("kv-plan", "-m", STORIES, "--kv-dtype", "fp16", "--json").stdout)
    with Server(STORIES, "--kv-cache-memory", "512MiB") as s:
        r = requests.get(s.url("/v1/kv_plan"), timeout=30)
        assert r.status_code == 200
        plan = r.json()
        # 5 layers x 4 KV heads x head dim 8 x K and V x 2 bytes
        assert plan["kv_bytes_per_token"] == 2 * 5 * 4 * 8 * 2 == cli["kv_bytes_per_token"]
        assert plan["max_kv_tokens"] == (512 << 20) // plan["kv_bytes_per_token"]
        bad = requests.get(s.url("/v1/kv_plan?gpu=tpu-v9"), timeout=30)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "gpu"


def test_speculative_server_keeps_greedy_output():
    body = {"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0}
    outs = []
    for extra in ([], ["--speculative", "ngram", "--num-speculative-tokens", "4"]):
        with Server(STORIES, *extra) as s:
            r = requests.post(s.url("/v1/completions"), json=body, timeout=60)
            assert r.status_code == 200
            outs.append(r.json()["choices"][0]["text"])
    assert outs[0] == outs[1]


def test_bad_server_options_refused():
    for args in (["--speculative", "sometimes"], ["--device", "tpu"],
                 ["--speculative", "draft"], ["--tensor-parallel-size", "0"]):
        p = run_pagoda("serve", "-m", STORIES, "--port", "0", *args, check=False, timeout=30)
        assert p.returncode == 2, args
        assert p.stderr.decode().strip().count("\n") == 0, p.stderr
