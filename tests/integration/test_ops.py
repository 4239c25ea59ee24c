"""Operations files: configs/*.json, docker/ (Dockerfiles, systemd units), docker/k8s/.

(a) every example config is accepted by `pagoda serve` (listening, ready, SIGTERM -> exit 0), and
    its keys are options of `pagoda serve --help`; none holds an API key;
(b) the systemd units pass `systemd-analyze verify` (skipped where systemd-analyze is missing)
    and stop later than the drain timeout;
(c) the Kubernetes YAML parses; the probes hit /health on the container port; the HPAs ask for a
    metric that the Prometheus adapter rule derives from a metric the server really exports
    (read from a live server's /metrics);
(d) no hadolint and no Docker engine here, so the images are never built by the tests: instead
    the Dockerfiles' apt package lists are checked against scripts/install-deps.sh (build stage)
    and against the libraries the binary links (runtime stage), and the image's HEALTHCHECK
    command is run against a live server.
"""
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import util

ROOT = util.ROOT
BIN = Path(os.environ.get("PAGODA_SERVER_BIN", util.PAGODA))
STORIES = util.DATA / "models" / "stories260K.gguf"
CONFIGS = sorted((ROOT / "configs").glob("*.json"))
DOCKER = ROOT / "docker"
K8S = DOCKER / "k8s"
UNITS = sorted(DOCKER.glob("*.service"))
DEFAULT_DRAIN = 30  # --drain-timeout's default (checked against --help below)
# Packages of scripts/install-deps.sh that only the tests need (sanitizer build, test venv,
# model download, the HAProxy of tests/routers); everything else in its list is the build list
# the images must install.
TEST_ONLY_DEPS = {"clang", "python3-venv", "curl", "haproxy"}
# Debian 12 runtime package of each library -dev package; Ubuntu 24.04 (the CUDA images) renamed
# two of them in its 64-bit time_t transition.
RUNTIME_OF = {"libcjson-dev": "libcjson1", "libuv1-dev": "libuv1",
              "libmicrohttpd-dev": "libmicrohttpd12", "libsystemd-dev": "libsystemd0",
              "libzmq3-dev": "libzmq5"}  # (msgpack-c: the packer Pagoda uses is its headers')
UBUNTU_2404 = {"libuv1": "libuv1t64", "libmicrohttpd12": "libmicrohttpd12t64"}
# and msgpack-c 6 split its C library's -dev package from the C++ one
UBUNTU_2404_BUILD = {"libmsgpack-dev": "libmsgpack-c-dev"}


# ---------------------------------------------------------------------------------------------
# a live `pagoda serve`
class Serve:
    """`pagoda serve ARGS` with stderr in a file (never a full pipe); events() parses its JSON
    log lines."""

    def __init__(self, *args, env=None):
        assert BIN.exists(), f"build pagoda first: {BIN} is missing"
        self.log = tempfile.NamedTemporaryFile(prefix="pagoda-ops-", suffix=".log", delete=False)
        e = dict(os.environ)
        for k in ("PAGODA_API_KEY", "PAGODA_MODEL"):
            e.pop(k, None)
        e.update(env or {})
        self.cmd = [str(BIN), "serve"] + [str(a) for a in args]
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=self.log,
                                     env=e, cwd=ROOT)
        self.port = None

    def stderr(self):
        return Path(self.log.name).read_text(errors="replace")

    def events(self):
        out = []
        for line in self.stderr().splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    def wait_event(self, name, timeout=120):
        deadline = time.time() + timeout
        while True:
            for ev in self.events():
                if ev.get("event") == name:
                    return ev
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.cmd} exited {self.proc.returncode} before "
                                     f"'{name}':\n{self.stderr()[-4000:]}")
            if time.time() > deadline:
                self.kill()
                raise AssertionError(f"no '{name}' event in {timeout}s:\n{self.stderr()[-4000:]}")
            time.sleep(0.02)

    def start(self):
        ev = self.wait_event("listening")
        self.port = ev["port"]
        assert isinstance(self.port, int) and self.port > 0, ev
        self.wait_event("ready")
        return self

    def get(self, path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def stop(self, timeout=60):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"ignored SIGTERM for {timeout}s:\n{self.stderr()[-4000:]}")
        assert rc == 0, f"{self.cmd} exited {rc} on SIGTERM:\n{self.stderr()[-4000:]}"
        assert any(ev.get("event") == "stopped" for ev in self.events()), self.stderr()[-2000:]
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.kill()
            raise

    def __exit__(self, *exc):
        if exc[0] is not None:
            self.kill()
        else:
            self.stop()
        return False


def help_options():
    """{option name: default string or None} parsed from `pagoda serve --help`."""
    p = util.run_pagoda("serve", "--help", timeout=30)
    text = p.stdout.decode()
    opts = {}
    for m in re.finditer(r"--([a-z][a-z0-9-]*)(?: V)?\s+.*?(?:\[([^\]]*)\])?(?: \(env \w+\))?$",
                         text, re.M):
        opts[m.group(1)] = m.group(2)
    assert "model" in opts and "port" in opts, text
    return opts


@pytest.fixture(scope="module")
def serve_help():
    return help_options()


# ---------------------------------------------------------------------------------------------
# (a) the example configs
def test_configs_exist():
    names = {c.name for c in CONFIGS}
    assert {"serve-cpu.json", "serve-gpu.json"} <= names, names
    assert (ROOT / "configs" / "README.md").exists()


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c.name for c in CONFIGS])
def test_config_keys_are_serve_options(cfg, serve_help):
    data = json.loads(cfg.read_text())
    assert isinstance(data, dict) and data
    unknown = set(data) - set(serve_help) - {"config"}
    assert not unknown, f"{cfg.name}: not `pagoda serve` options: {sorted(unknown)}"
    assert "api-key" not in data, "API keys belong in PAGODA_API_KEY, never in a config file"
    # the units and manifests stop later than the drain: keep the examples at the default or less
    assert int(data.get("drain-timeout", DEFAULT_DRAIN)) <= DEFAULT_DRAIN, cfg.name


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c.name for c in CONFIGS])
def test_config_accepted_by_serve(cfg):
    # The file is parsed and range-checked in full before the flags apply; the flags only swap in
    # the tiny test model and a free port, and keep the KV budget small on a shared test machine
    # (the GPU example asks for tens of GiB). A key in the environment guards the API while the
    # server briefly listens on the file's host (0.0.0.0).
    with Serve("--config", cfg, "--port", "0", "-m", STORIES, "--kv-cache-memory", "64MiB",
               "--threads", "2", env={"PAGODA_API_KEY": "ops-test-key"}) as s:
        status, body = s.get("/health")
        assert status == 200, body
        evs = s.events()
        listening = next(e for e in evs if e.get("event") == "listening")
        assert listening["host"] == json.loads(cfg.read_text()).get("host", "127.0.0.1")
        # events arrive in order: listening before ready
        names = [e.get("event") for e in evs]
        assert names.index("listening") < names.index("ready"), names


def test_device_and_tp_environment_reach_serve():
    # PAGODA_DEVICE / PAGODA_TENSOR_PARALLEL are read by generate, batch and bench; serve's option
    # table must read them too (it used to keep its "cpu" default). A bad value is refused with
    # the value named, before the model loads; an ignored variable would leave serve running.
    for env, bad in (("PAGODA_DEVICE", "tpu"), ("PAGODA_TENSOR_PARALLEL", "0")):
        e = {k: v for k, v in os.environ.items() if k not in ("PAGODA_API_KEY", "PAGODA_MODEL")}
        e[env] = bad
        p = subprocess.run([str(BIN), "serve", "--port", "0", "-m", str(STORIES)],
                           capture_output=True, text=True, timeout=60, env=e)
        assert p.returncode != 0, (env, p.stderr)
        assert bad in p.stderr or env in p.stderr, (env, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_config_file_with_api_key_is_refused():
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"api-key": "sk-secret"}, f)
    p = subprocess.run([str(BIN), "serve", "--config", f.name, "--port", "0", "-m", str(STORIES)],
                       capture_output=True, text=True, timeout=60)
    os.unlink(f.name)
    assert p.returncode != 0 and "PAGODA_API_KEY" in p.stderr, p.stderr


# ---------------------------------------------------------------------------------------------
# (b) the systemd units
def unit_settings(path):
    """{key: [values]} of a unit file's [Service] section."""
    out, section = {}, None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        k, _, v = line.partition("=")
        out.setdefault((section, k.strip()), []).append(v.strip())
    return out


def seconds(v):
    m = re.fullmatch(r"(\d+)\s*(s|sec|min|m)?", v)
    assert m, v
    return int(m.group(1)) * (60 if m.group(2) in ("min", "m") else 1)


def test_units_exist_and_settings():
    names = {u.name for u in UNITS}
    assert {"pagoda.service", "pagoda-simple.service"} <= names, names
    for u in UNITS:
        s = unit_settings(u)
        svc = lambda k: s.get(("Service", k), [None])[-1]  # noqa: E731
        assert svc("Type") == ("notify" if u.name == "pagoda.service" else "simple"), u.name
        assert svc("ExecStart") == "/usr/local/bin/pagoda serve --config /etc/pagoda/config.json"
        assert svc("EnvironmentFile") == "-/etc/pagoda/env"
        assert svc("KillSignal") == "SIGTERM"
        assert svc("Restart") == "on-failure"
        assert seconds(svc("TimeoutStopSec")) > DEFAULT_DRAIN
        for k in ("ProtectSystem", "ProtectHome", "PrivateTmp", "NoNewPrivileges", "ReadOnlyPaths",
                  "LimitNOFILE"):
            assert svc(k), f"{u.name}: no {k}="
        assert svc("DynamicUser") == "yes" or svc("User"), u.name
        assert svc("ProtectSystem") == "strict"


def test_drain_default_matches_help(serve_help):
    assert serve_help.get("drain-timeout") == str(DEFAULT_DRAIN), serve_help.get("drain-timeout")


def test_binary_type_notify_needs_libsystemd():
    """pagoda.service is Type=notify: the Debian build (libsystemd-dev installed) links libsystemd."""
    if not shutil.which("ldd"):
        pytest.skip("ldd is not installed")
    p = subprocess.run(["ldd", str(BIN)], capture_output=True, text=True)
    dpkg = subprocess.run(["dpkg", "-s", "libsystemd-dev"], capture_output=True)
    if dpkg.returncode != 0:
        pytest.skip("libsystemd-dev is not installed: this build needs pagoda-simple.service")
    assert "libsystemd.so" in p.stdout, p.stdout


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_unit_verifies(unit, tmp_path):
    sa = shutil.which("systemd-analyze")
    if not sa:
        pytest.skip("systemd-analyze is not installed on this machine")
    # verify insists that ExecStart's binary exists: point it at the build under test
    text = unit.read_text().replace("/usr/local/bin/pagoda", str(BIN.resolve()))
    (tmp_path / unit.name).write_text(text)
    p = subprocess.run([sa, "verify", "--man=no", str(tmp_path / unit.name)],
                       capture_output=True, text=True, timeout=60)
    problems = [ln for ln in (p.stdout + p.stderr).splitlines() if unit.name in ln]
    assert p.returncode == 0 and not problems, p.stdout + p.stderr


# ---------------------------------------------------------------------------------------------
# (c) Kubernetes manifests
def k8s_docs():
    yaml = pytest.importorskip("yaml")
    docs = {}
    for f in sorted(K8S.glob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            if d:
                docs.setdefault(d["kind"], []).append((f.name, d))
    return docs


def test_k8s_yaml_parses():
    docs = k8s_docs()
    for kind in ("Deployment", "Service", "HorizontalPodAutoscaler", "ServiceMonitor", "ConfigMap"):
        assert kind in docs, f"no {kind} in docker/k8s/"


def pagoda_container():
    (_, dep), = k8s_docs()["Deployment"]
    spec = dep["spec"]["template"]["spec"]
    c = next(c for c in spec["containers"] if c["name"] == "pagoda")
    return dep, spec, c


def resolve_port(port, container):
    for p in container["ports"]:
        if port in (p.get("name"), p["containerPort"]):
            return p["containerPort"]
    raise AssertionError(f"port {port!r} is not a container port of {container['name']}")


def arg_value(args, name, default=None):
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
    return default


def test_deployment_probes_and_shutdown():
    dep, spec, c = pagoda_container()
    port = int(arg_value(c.get("args", []), "--port", 8000))
    assert resolve_port("http", c) == port == 8000
    for probe in ("readinessProbe", "livenessProbe"):
        hg = c[probe]["httpGet"]
        assert hg["path"] == "/health", probe
        assert resolve_port(hg["port"], c) == port, probe
    assert c["livenessProbe"].get("initialDelaySeconds", 0) >= 60, "liveness must wait for the load"
    env = {e["name"]: e for e in c["env"]}
    assert "secretKeyRef" in env["PAGODA_API_KEY"]["valueFrom"]
    assert env["PAGODA_MODEL"]["value"].startswith("/models/")
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/models"].get("readOnly") is True
    vol = next(v for v in spec["volumes"] if v["name"] == mounts["/models"]["name"])
    assert "persistentVolumeClaim" in vol or "image" in vol
    pre = c["lifecycle"]["preStop"]
    sleep = int(pre["exec"]["command"][-1]) if "exec" in pre else int(pre["sleep"]["seconds"])
    drain = int(arg_value(c.get("args", []), "--drain-timeout", DEFAULT_DRAIN))
    assert spec["terminationGracePeriodSeconds"] > sleep + drain
    assert c["resources"]["requests"] and c["resources"]["limits"]


def test_deployment_args_are_serve_options(serve_help):
    _, _, c = pagoda_container()
    for a in c.get("args", []):
        if a.startswith("--"):
            assert a[2:] in serve_help, f"deployment.yaml: {a} is not a `pagoda serve` option"


def test_service_and_servicemonitor_target_the_pods():
    docs = k8s_docs()
    dep, _, c = pagoda_container()
    labels = dep["spec"]["template"]["metadata"]["labels"]
    (_, svc), = docs["Service"]
    assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    sp = svc["spec"]["ports"][0]
    assert resolve_port(sp["targetPort"], c) == 8000
    (_, sm), = docs["ServiceMonitor"]
    assert all(svc["metadata"]["labels"].get(k) == v
               for k, v in sm["spec"]["selector"]["matchLabels"].items())
    ep = sm["spec"]["endpoints"][0]
    assert ep["port"] == sp["name"] and ep["path"] == "/metrics"


@pytest.fixture(scope="module")
def live_metrics():
    """/metrics text of a server started with the Deployment's own arguments."""
    _, _, c = pagoda_container()
    with Serve(*c.get("args", []), "--port", "0", "--host", "127.0.0.1", "-m", STORIES,
               "--kv-cache-memory", "64MiB", "--threads", "2") as s:
        status, text = s.get("/metrics")
    assert status == 200, text
    return text


def adapter_rules():
    yaml = pytest.importorskip("yaml")
    (_, cm), = k8s_docs()["ConfigMap"]
    return yaml.safe_load(cm["data"]["config.yaml"])["rules"]


def adapter_name(rule, series):
    """The custom-metrics name prometheus-adapter gives `series` under `rule`, or None."""
    q = re.search(r'__name__=~"([^"]+)"', rule["seriesQuery"])
    if not q or not re.fullmatch(q.group(1).strip("^$"), series):
        return None
    m = re.match(rule["name"]["matches"], series)
    if not m:
        return None
    return re.sub(r"\$\{(\d+)\}", lambda g: m.group(int(g.group(1))), rule["name"]["as"])


def test_hpa_metric_is_exported(live_metrics):
    exported = set(re.findall(r"^# TYPE (\S+) ", live_metrics, re.M))
    assert "pagoda:num_requests_waiting" in exported, sorted(exported)
    rules = adapter_rules()
    exposed = {}
    for series in exported:
        for r in rules:
            name = adapter_name(r, series)
            if name:
                exposed[name] = series
    for r in rules:
        assert {"namespace", "pod"} <= set(r["resources"]["overrides"])
    hpas = k8s_docs()["HorizontalPodAutoscaler"]
    asked = {}
    for fname, h in hpas:
        assert h["apiVersion"] == "autoscaling/v2", fname
        assert h["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                               "name": "pagoda"}, fname
        for m in h["spec"]["metrics"]:
            assert m["type"] == "Pods", fname
            name = m["pods"]["metric"]["name"]
            assert ":" not in name, f"{fname}: the adapter exposes sanitized names"
            assert name in exposed, f"{fname}: {name} is not what the adapter makes of any " \
                                    f"exported metric ({sorted(exposed)})"
            asked[fname] = exposed[name]
    assert asked.get("hpa.yaml") == "pagoda:num_requests_waiting", asked
    assert "pagoda:kv_cache_usage_perc" in asked.values(), asked


# ---------------------------------------------------------------------------------------------
# (d) the Dockerfiles
def install_deps_build_list():
    text = (ROOT / "scripts" / "install-deps.sh").read_text()
    m = re.search(r"pkgs=\(([^)]*)\)", text)
    assert m, "no pkgs=(...) in scripts/install-deps.sh"
    return set(m.group(1).split()) - TEST_ONLY_DEPS


def dockerfile_stages(path):
    """[(FROM line, [apt packages installed in that stage])]; continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    stages = []
    for line in text.splitlines():
        s = line.strip()
        if s.upper().startswith("FROM "):
            stages.append((s, []))
        elif s.upper().startswith("RUN ") and stages:
            for part in re.split(r"&&|;", s[4:]):
                w = shlex.split(part)
                if "apt-get" in w and "install" in w:
                    pk = w[w.index("install") + 1:]
                    stages[-1][1].extend(x for x in pk if not x.startswith("-"))
    return stages


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_dockerfile_build_stage_matches_install_deps(name):
    stages = dockerfile_stages(DOCKER / name)
    assert len(stages) == 2, f"{name}: expected a build and a runtime stage"
    (build_from, build_pkgs), (run_from, run_pkgs) = stages
    want = install_deps_build_list()
    if name == "Dockerfile.cuda":
        want = {UBUNTU_2404_BUILD.get(p, p) for p in want}
    assert set(build_pkgs) == want, f"{name}: build stage installs {sorted(build_pkgs)}, " \
                                    f"scripts/install-deps.sh builds with {sorted(want)}"
    runtime = {RUNTIME_OF[p] for p in install_deps_build_list() if p in RUNTIME_OF}
    if name == "Dockerfile.cpu":
        assert re.match(r"FROM debian:12\S* AS build", build_from), build_from
        assert run_from.startswith("FROM debian:12"), run_from
    else:
        assert "nvidia/cuda:" in build_from and "-devel-" in build_from, build_from
        assert "nvidia/cuda:" in run_from and "-runtime-" in run_from, run_from
        runtime = {UBUNTU_2404.get(p, p) for p in runtime}
    assert set(run_pkgs) == runtime, f"{name}: runtime stage installs {sorted(run_pkgs)}, " \
                                     f"the binary needs {sorted(runtime)}"


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_dockerfile_runtime_settings(name):
    text = (DOCKER / name).read_text()
    assert re.search(r"^EXPOSE 8000$", text, re.M)
    assert re.search(r"^USER (?!root|0\b)\S+", text, re.M), "the image must run as non-root"
    assert re.search(r"^HEALTHCHECK .*\n?.*/health", text, re.M)
    ep = re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M)
    assert ep and json.loads(ep.group(1))[-3:] == ["serve", "--host", "0.0.0.0"], ep
    assert "/models" in text
    if name == "Dockerfile.cuda":
        assert "-DPAGODA_CUDA=ON" in text


def test_runtime_packages_are_what_the_binary_links():
    """The CPU image is Debian 12 like this machine: each library the binary names in DT_NEEDED
    comes from a runtime package of Dockerfile.cpu (or from libc6, in every image)."""
    for tool in ("readelf", "ldd", "dpkg"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed")
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]",
                        subprocess.run(["readelf", "-d", str(BIN)], capture_output=True,
                                       text=True).stdout)
    paths = dict(re.findall(r"^\s*(\S+) => (\S+)", subprocess.run(
        ["ldd", str(BIN)], capture_output=True, text=True).stdout, re.M))
    pkgs = set()
    for lib in needed:
        if re.match(r"lib(asan|ubsan|lsan|tsan)", lib):
            continue  # sanitizer builds are never shipped
        out = subprocess.run(["dpkg", "-S", os.path.realpath(paths[lib])], capture_output=True,
                             text=True)
        if out.returncode != 0:  # e.g. /lib vs /usr/lib (merged /usr)
            out = subprocess.run(["dpkg", "-S", paths[lib]], capture_output=True, text=True)
        assert out.returncode == 0, f"{lib}: {out.stderr}"
        pkgs.add(out.stdout.split(":")[0])
    pkgs -= {"libc6"}
    _, (_, run_pkgs) = dockerfile_stages(DOCKER / "Dockerfile.cpu")
    assert pkgs == set(run_pkgs), f"binary links {sorted(pkgs)}; image installs {sorted(run_pkgs)}"


def test_healthcheck_command_against_live_server():
    """The image's HEALTHCHECK (bash /dev/tcp, no curl) run here against a real server: it
    fails while nothing listens, and succeeds once /health is 200."""
    text = re.sub(r"\\\n", " ", (DOCKER / "Dockerfile.cpu").read_text())
    m = re.search(r"^HEALTHCHECK .*?CMD (\[.*\])\s*$", text, re.M)
    assert m, "no exec-form HEALTHCHECK CMD"
    cmd = json.loads(m.group(1))
    if not shutil.which(cmd[0]):
        pytest.skip(f"{cmd[0]} is not installed")
    with Serve("--port", "0", "-m", STORIES, "--threads", "2", "--kv-cache-memory", "64MiB") as s:
        ok = subprocess.run([a.replace("8000", str(s.port)) for a in cmd], timeout=30)
        assert ok.returncode == 0
        port = s.port
    dead = subprocess.run([a.replace("8000", str(port)) for a in cmd], timeout=30,
                          capture_output=True)
    assert dead.returncode != 0
