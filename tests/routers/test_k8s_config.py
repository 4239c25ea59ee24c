"""The Kubernetes files for the llm-d / Gateway API Inference Extension endpoint picker (EPP),
docker/k8s/llm-d/, against the Deployment beside them and a live Pagoda.

- every YAML file in docker/k8s/ and docker/k8s/llm-d/ parses;
- the EndpointPickerConfig uses only plugin types and parameters that the targeted EPP
  (GAIE v1.5.0, llm-d-inference-scheduler v0.8.0) defines (Go's JSON decoding would ignore a
  misspelt parameter silently), every pluginRef resolves, and the profile scores by queue,
  KV-cache utilization, prefix cache and LoRA affinity;
- the pods carry the engine label that selects the config's engineConfigs entry, and the
  InferencePool (and the Helm values) select those pods on their HTTP port;
- every metric the entry names exists in the /metrics of a Pagoda started with the
  Deployment's own arguments, with the labels the extractor reads; and so does every name of
  the EPP's built-in `vllm` engine under --metrics-prefix vllm;
- the probe paths and the metrics path answer 200.
"""
import re

import pytest
import requests
import yaml

import util
from server_util import Server

K8S = util.ROOT / "docker" / "k8s"
LLMD = K8S / "llm-d"
STORIES = util.DATA / "models" / "stories260K.gguf"

# The plugin types and the parameters the config uses, as GAIE v1.5.0 defines them
# (pkg/epp/framework/plugins/...: each plugin's *Type constant and its parameter struct).
PLUGINS = {
    "metrics-data-source": {"scheme", "path", "insecureSkipVerify"},
    "core-metrics-extractor": {"engineLabelKey", "defaultEngine", "engineConfigs"},
    "queue-scorer": set(),
    "kv-cache-utilization-scorer": set(),
    "approx-prefix-cache-producer": {"autoTune", "blockSizeTokens", "blockSize",
                                     "maxPrefixBlocksToMatch", "maxPrefixTokensToMatch",
                                     "lruCapacityPerServer"},
    "prefix-cache-scorer": set(),
    "lora-affinity-scorer": set(),
    "max-score-picker": set(),
    "single-profile-handler": set(),
}
ENGINE_FIELDS = {"name", "queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "loraSpec",
                 "cacheInfoSpec", "cacheBlockSizeLabelName", "cacheNumBlocksLabelName",
                 "cacheBlockSizeSpec", "cacheNumBlocksSpec"}
# The EPP's built-in engine for vLLM (what routers that hard-code vLLM's names read).
VLLM_ENGINE = {"name": "vllm", "queuedRequestsSpec": "vllm:num_requests_waiting",
               "runningRequestsSpec": "vllm:num_requests_running",
               "kvUsageSpec": "vllm:kv_cache_usage_perc", "loraSpec": "vllm:lora_requests_info",
               "cacheInfoSpec": "vllm:cache_config_info"}
LORA_LABELS = {"running_lora_adapters", "waiting_lora_adapters", "max_lora"}


def docs(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def one(path, kind):
    found = [d for d in docs(path) if d.get("kind") == kind]
    assert len(found) == 1, f"{path.name}: {len(found)} {kind}"
    return found[0]


def pod():
    dep = one(K8S / "deployment.yaml", "Deployment")
    spec = dep["spec"]["template"]
    c = next(c for c in spec["spec"]["containers"] if c["name"] == "pagoda")
    return spec["metadata"]["labels"], c


def http_port(c):
    return next(p["containerPort"] for p in c["ports"] if p["name"] == "http")


def epp():
    return one(LLMD / "epp-config.yaml", "EndpointPickerConfig")


def plugin(cfg, ref):
    found = [p for p in cfg["plugins"] if p.get("name", p["type"]) == ref]
    assert len(found) == 1, f"pluginRef {ref!r} names {len(found)} plugins"
    return found[0]


def engine_configs(cfg):
    ex = next(p for p in cfg["plugins"] if p["type"] == "core-metrics-extractor")
    return ex["parameters"]


def parse_spec(spec):
    """An EPP metric spec, `name` or `name{label=value,...}` -> (name, {label: value})."""
    m = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?", spec)
    assert m, spec
    labels = dict(kv.split("=", 1) for kv in m[2].split(",")) if m[2] else {}
    return m[1], {k.strip(): v.strip().strip('"') for k, v in labels.items()}


def families(text):
    """{name: (type, [(labels, value)])} of a Prometheus text page."""
    out = {}
    for name, typ in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        out[name] = (typ, [])
    for line in text.splitlines():
        m = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)", line)
        if m and m[1] in out:
            out[m[1]][1].append((dict(re.findall(r'(\w+)="([^"]*)"', m[2] or "")),
                                 float(m[3])))
    return out


def serve_args(prefix):
    """The Deployment's own `pagoda serve` arguments, sized for a test machine."""
    _, c = pod()
    args, skip = [], False
    for a in c.get("args", []):
        if skip:
            skip = False
        elif a in ("--port", "--threads", "--kv-cache-memory", "--metrics-prefix"):
            skip = True  # the test server's own
        else:
            args.append(a)
    dep_prefix = next((c["args"][i + 1] for i, a in enumerate(c.get("args", []))
                       if a == "--metrics-prefix"), "pagoda")
    # LoRA slots, so that lora_requests_info is published (it is not without adapters)
    return args + ["--kv-cache-memory", "64MiB", "--allow-runtime-lora-updating",
                   "--metrics-prefix", prefix or dep_prefix]


@pytest.fixture(scope="module")
def live():
    """{prefix: (server url, /metrics text)}: one server with the Deployment's prefix, one with
    vllm. The servers stay up for the probe checks."""
    out, servers = {}, []
    try:
        for prefix in (None, "vllm"):
            s = Server(STORIES, *serve_args(prefix), threads=1).start()
            servers.append(s)
            r = requests.get(s.url("/metrics"), timeout=10)
            assert r.status_code == 200, r.text
            out[prefix or "deployment"] = (s, r.text)
        yield out
    finally:
        for s in servers:
            s.stop()


def test_every_yaml_file_parses():
    files = sorted(K8S.glob("*.yaml")) + sorted(LLMD.glob("*.yaml"))
    assert {f.name for f in LLMD.glob("*.yaml")} == {"epp-config.yaml", "inferencepool.yaml",
                                                      "values.yaml"}
    for f in files:
        ds = docs(f)
        assert ds, f
        for d in ds:
            assert isinstance(d, dict), f
            if f.name != "values.yaml":  # Helm values, not an object
                assert d.get("apiVersion") and d.get("kind"), f


def test_epp_config_uses_real_plugins_and_parameters():
    cfg = epp()
    assert cfg["apiVersion"] == "inference.networking.x-k8s.io/v1alpha1"
    assert set(cfg) <= {"apiVersion", "kind", "featureGates", "plugins", "schedulingProfiles",
                        "saturationDetector", "dataLayer", "flowControl", "parser"}, set(cfg)
    for p in cfg["plugins"]:
        assert p["type"] in PLUGINS, f"{p['type']}: not a plugin of the targeted EPP"
        assert set(p.get("parameters") or {}) <= PLUGINS[p["type"]], p
    for ec in engine_configs(cfg)["engineConfigs"]:
        assert set(ec) <= ENGINE_FIELDS, ec
    (profile,) = cfg["schedulingProfiles"]
    refs = [x["pluginRef"] for x in profile["plugins"]]
    types = {plugin(cfg, r)["type"] for r in refs}
    assert {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer",
            "lora-affinity-scorer", "max-score-picker"} <= types, types
    for x in profile["plugins"]:
        if x["pluginRef"].endswith("-scorer"):
            assert x.get("weight", 1) > 0, x
    # the prefix scorer reads what the producer writes; the data layer wires scrape -> extract
    assert any(p["type"] == "approx-prefix-cache-producer" for p in cfg["plugins"])
    (src,) = cfg["dataLayer"]["sources"]
    assert plugin(cfg, src["pluginRef"])["type"] == "metrics-data-source"
    assert [plugin(cfg, e["pluginRef"])["type"] for e in src["extractors"]] == [
        "core-metrics-extractor"]


def test_pods_select_the_pagoda_engine_and_the_pool_selects_the_pods():
    labels, c = pod()
    params = engine_configs(epp())
    names = [ec["name"] for ec in params["engineConfigs"]]
    assert params["defaultEngine"] in names
    assert labels.get(params["engineLabelKey"]) in names, (params["engineLabelKey"], labels)
    pool = one(LLMD / "inferencepool.yaml", "InferencePool")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    sel = pool["spec"]["selector"]["matchLabels"]
    assert sel and all(labels.get(k) == v for k, v in sel.items()), (sel, labels)
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [http_port(c)]
    ref = pool["spec"]["endpointPickerRef"]
    assert ref["name"] and ref["port"]["number"] == 9002
    assert ref["failureMode"] in ("FailOpen", "FailClose")
    (values,) = docs(LLMD / "values.yaml")
    assert values["inferencePool"]["modelServers"]["matchLabels"] == sel
    assert values["inferencePool"]["targetPorts"] == pool["spec"]["targetPorts"]
    # the helm command in values.yaml loads epp-config.yaml under the file name the EPP reads
    m = re.search(r"pluginsCustomConfig\.([\w\\.-]+)=docker/k8s/llm-d/epp-config\.yaml",
                  (LLMD / "values.yaml").read_text())
    assert m and m[1].replace("\\.", ".") == values["inferenceExtension"]["pluginsConfigFile"]


def check_engine(ec, text):
    """Every spec of an engineConfigs entry names a family of the page, with a series that
    matches its labels and carries the labels the extractor reads."""
    fam = families(text)
    checked = 0
    for field in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "loraSpec",
                  "cacheInfoSpec", "cacheBlockSizeSpec", "cacheNumBlocksSpec"):
        if not ec.get(field):
            continue
        name, want = parse_spec(ec[field])
        assert name in fam, f"{ec['name']}.{field}: {name} is not in /metrics"
        typ, series = fam[name]
        hits = [(lb, v) for lb, v in series if all(lb.get(k) == x for k, x in want.items())]
        assert hits, f"{ec['name']}.{field}: no series of {name} has {want}"
        lb, v = max(hits, key=lambda h: h[1])  # the extractor takes the largest (latest)
        assert typ == "gauge", (name, typ)
        if field == "kvUsageSpec":
            assert 0 <= v <= 1, (name, v)
        elif field in ("queuedRequestsSpec", "runningRequestsSpec"):
            assert v == int(v) >= 0, (name, v)
        elif field == "loraSpec":
            assert LORA_LABELS <= set(lb), (name, lb)
            assert int(lb["max_lora"]) > 0 and v > 0, (name, lb, v)
        elif field == "cacheInfoSpec":
            for label in (ec.get("cacheBlockSizeLabelName") or "block_size",
                          ec.get("cacheNumBlocksLabelName") or "num_gpu_blocks"):
                assert int(lb[label]) > 0, (name, label, lb)
        checked += 1
    return checked


def test_the_pagoda_engine_names_exist_in_a_live_metrics_page(live):
    (ec,) = [e for e in engine_configs(epp())["engineConfigs"] if e["name"] == "pagoda"]
    assert check_engine(ec, live["deployment"][1]) == 5


def test_the_builtin_vllm_engine_names_exist_under_metrics_prefix_vllm(live):
    assert check_engine(VLLM_ENGINE, live["vllm"][1]) == 5
    with pytest.raises(AssertionError):  # and the check can fail: not under Pagoda's prefix
        check_engine(VLLM_ENGINE, live["deployment"][1])


def test_probe_and_metrics_paths_answer_200(live):
    _, c = pod()
    s = live["deployment"][0]
    for probe in ("readinessProbe", "livenessProbe"):
        hg = c[probe]["httpGet"]
        assert hg["port"] in ("http", http_port(c)), probe
        r = requests.get(s.url(hg["path"]), timeout=10)
        assert r.status_code == 200, (probe, hg["path"], r.status_code)
    ds = plugin(epp(), "metrics-data-source")["parameters"]
    assert ds["scheme"] == "http"
    assert requests.get(s.url(ds["path"]), timeout=10).status_code == 200
