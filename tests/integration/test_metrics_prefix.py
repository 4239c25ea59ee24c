"""--metrics-prefix vllm: /metrics publishes every `pagoda:` series under vLLM's `vllm:` name, for
routers that hard-code vLLM's names (the llm-d / Gateway API Inference Extension endpoint
picker's built-in `vllm` engine reads vllm:num_requests_waiting, vllm:num_requests_running,
vllm:kv_cache_usage_perc, vllm:lora_requests_info and vllm:cache_config_info).

Two servers on the same model, adapter and arguments, one with each prefix, are sent the same
requests; their pages must then be the same page line for line, but for the prefix and for the
values that measure time (histogram sums and buckets of *_seconds, and lora_requests_info,
whose value is a Unix time as in vLLM)."""
import re
import sys
import time
from pathlib import Path

import pytest
import requests

sys.path.insert(0, str(Path(__file__).parent))
from lora_ref import make_adapter  # noqa: E402
from server_util import Server  # noqa: E402

SAMPLE = re.compile(r"^([a-z]+):([a-zA-Z0-9_]+)(\{[^}]*\})? (\S+)$")
META = re.compile(r"^# (HELP|TYPE) ([a-z]+):(\S+) (.*)$")


@pytest.fixture(scope="module")
def pages(tiny_models, tmp_path_factory):
    model = tiny_models["llama"]["hf"]
    adapter = make_adapter(model, tmp_path_factory.mktemp("lora") / "a", 1, r=4, lora_alpha=8,
                           target_modules=["q_proj", "v_proj"])
    out = {}
    for prefix in ("pagoda", "vllm"):
        extra = [] if prefix == "pagoda" else ["--metrics-prefix", "vllm"]
        with Server(model, "--lora-modules", f"a={adapter}", *extra) as s:
            for m in ("a", None):
                body = {"prompt": [1, 450, 4996, 17354], "max_tokens": 4, "temperature": 0,
                        "ignore_eos": True}
                if m:
                    body["model"] = m
                r = requests.post(s.url("/v1/completions"), json=body, timeout=60)
                assert r.status_code == 200, r.text
            r = requests.get(s.url("/metrics"), timeout=10)
            assert r.status_code == 200, r.text
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            out[prefix] = r.text
    return out


def test_every_pagoda_name_is_published_as_vllm(pages):
    p, v = pages["pagoda"].splitlines(), pages["vllm"].splitlines()
    assert "pagoda:" not in pages["vllm"], "a pagoda: name left with --metrics-prefix vllm"
    assert "vllm:" not in pages["pagoda"]
    assert len(p) == len(v) and len(p) > 100, (len(p), len(v))
    timed = 0
    for a, b in zip(p, v):
        if a.startswith("#"):
            ma, mb = META.match(a), META.match(b)
            assert ma and mb, (a, b)
            assert (ma[2], mb[2]) == ("pagoda", "vllm"), (a, b)
            assert (ma[1], ma[3], ma[4]) == (mb[1], mb[3], mb[4]), (a, b)
            continue
        sa, sb = SAMPLE.match(a), SAMPLE.match(b)
        assert sa and sb, (a, b)
        assert (sa[1], sb[1]) == ("pagoda", "vllm"), (a, b)
        assert (sa[2], sa[3]) == (sb[2], sb[3]), (a, b)  # same name, same labels
        if re.search(r"_seconds_(sum|bucket)$|^lora_requests_info$", sa[2]):
            timed += 1  # measured time: only the series' presence is comparable
        else:
            assert float(sa[4]) == float(sb[4]), (a, b)
    assert timed > 0


def test_the_names_the_endpoint_picker_reads(pages):
    """vLLM's names and labels, as llm-d's core-metrics-extractor reads them for its `vllm`
    engine: the queue, running and KV-usage gauges by value, cache_config_info by its
    block_size / num_gpu_blocks labels, lora_requests_info by max_lora and its two adapter
    lists (and vLLM's info-gauge value: the extractor takes the series with the largest)."""
    text = pages["vllm"]
    values = {}
    labels = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m:
            name = f"{m[1]}:{m[2]}"
            values[name] = float(m[4])
            labels[name] = dict(re.findall(r'(\w+)="([^"]*)"', m[3] or ""))
    for g in ("vllm:num_requests_waiting", "vllm:num_requests_running",
              "vllm:kv_cache_usage_perc"):
        assert g in values, g
        assert re.search(rf"^# TYPE {g} gauge$", text, re.M), g
    assert values["vllm:num_requests_running"] == 0 and values["vllm:num_requests_waiting"] == 0
    assert 0 <= values["vllm:kv_cache_usage_perc"] <= 1
    cc = labels["vllm:cache_config_info"]
    assert int(cc["block_size"]) == 16 and int(cc["num_gpu_blocks"]) > 0, cc
    lo = labels["vllm:lora_requests_info"]
    assert lo == {"model_name": lo["model_name"], "max_lora": "1", "running_lora_adapters": "",
                  "waiting_lora_adapters": ""}, lo
    assert abs(values["vllm:lora_requests_info"] - time.time()) < 600  # a Unix time
    assert re.search(r'^vllm:request_success_total\{[^}]*finished_reason="length"\} 2$', text,
                     re.M), text


def test_bad_prefix_is_refused(pagoda_bin):
    import subprocess
    p = subprocess.run([str(pagoda_bin), "serve", "--metrics-prefix", "sglang", "-m", "x"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "--metrics-prefix" in p.stderr and "pagoda|vllm" in p.stderr, \
        p.stderr
