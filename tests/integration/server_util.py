"""Runs a real `pagoda serve` for the server tests, and checks response bodies against the OpenAI
schema file.

The binary is $PAGODA_SERVER_BIN if set (e.g. an AddressSanitizer build), else the one util.py
names. A server is started on a free port (`--port 0`; the port comes from its first JSON log
line), is ready when /health answers 200, and must exit 0 on SIGTERM. Its stderr goes to a file
so that a chatty server never blocks on a full pipe; `Server.stderr()` reads it back."""
import functools
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import util

SERVER_BIN = Path(os.environ.get("PAGODA_SERVER_BIN", util.PAGODA))
STORIES = util.DATA / "models" / "stories260K.gguf"
OPENAPI = util.DATA / "openai-openapi" / "openapi.yaml"
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                     "SUMMARY: UndefinedBehaviorSanitizer", "SUMMARY: AddressSanitizer")


@functools.lru_cache(maxsize=None)
def is_sanitized(binary):
    """Whether binary was built with AddressSanitizer (its RSS then includes ASan's quarantine
    of freed memory, so memory-growth checks mean nothing)."""
    return b"__asan_init" in Path(binary).read_bytes()


class Server:
    def __init__(self, model, *args, binary=None, env=None, threads=2, ready_timeout=120):
        self.binary = Path(binary or SERVER_BIN)
        assert self.binary.exists(), f"build pagoda first: {self.binary} is missing"
        self.model = Path(model)
        self.args = [str(a) for a in args]
        self.env = dict(os.environ)
        self.env.pop("PAGODA_API_KEY", None)  # only a test that asks for a key gets one
        self.env.update(env or {})
        self.threads = threads
        self.ready_timeout = ready_timeout
        self.proc = None
        self.port = None
        self.exit_code = None

    # -- lifecycle --
    def start(self):
        self._log = tempfile.NamedTemporaryFile(prefix="pagoda-serve-", suffix=".log", delete=False)
        cmd = [str(self.binary), "serve", "-m", str(self.model), "--port", "0",
               "-t", str(self.threads)] + self.args
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._log,
                                     env=self.env, cwd=util.ROOT)
        deadline = time.time() + self.ready_timeout
        while self.port is None:
            if self.proc.poll() is not None:
                raise AssertionError(f"pagoda serve exited {self.proc.returncode}:\n{self.stderr()}")
            if time.time() > deadline:
                self.kill()
                raise AssertionError(f"pagoda serve printed no port:\n{self.stderr()}")
            for line in self.stderr().splitlines():
                if line.startswith("{") and '"listening"' in line:
                    self.port = json.loads(line)["port"]
                    break
            time.sleep(0.02)
        import requests
        while True:
            try:
                if requests.get(self.url("/health"), timeout=5).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            if self.proc.poll() is not None:
                raise AssertionError(f"pagoda serve exited {self.proc.returncode}:\n{self.stderr()}")
            if time.time() > deadline:
                self.kill()
                raise AssertionError(f"/health never answered 200:\n{self.stderr()}")
            time.sleep(0.05)

    def stop(self, timeout=60, check=True):
        """SIGTERM, wait, and (check) assert exit 0 and no sanitizer report. Returns stderr."""
        if self.proc is None:
            return ""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"pagoda serve ignored SIGTERM for {timeout}s:\n{self.stderr()}")
        self.exit_code = self.proc.returncode
        err = self.stderr()
        self.proc = None
        self._log.close()
        os.unlink(self._log.name)
        self._stderr_final = err
        if check:
            assert self.exit_code == 0, f"pagoda serve exited {self.exit_code}:\n{err[-4000:]}"
            check_no_sanitizer_report(err)
        return err

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        if exc[0] is not None:
            self.kill()
            return False
        self.stop()
        return False

    # -- access --
    def url(self, path=""):
        return f"http://127.0.0.1:{self.port}{path}"

    def stderr(self):
        if self.proc is None and hasattr(self, "_stderr_final"):
            return self._stderr_final
        return Path(self._log.name).read_text(errors="replace")

    @property
    def pid(self):
        return self.proc.pid

    def rss_kib(self):
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def metrics(self):
        """{name_without_labels_or_with_finished_reason: value} from /metrics."""
        import requests
        r = requests.get(self.url("/metrics"), timeout=10)
        assert r.status_code == 200, r.text
        return parse_metrics(r.text)

    def wait_metrics(self, pred, timeout=30):
        deadline = time.time() + timeout
        while True:
            m = self.metrics()
            if pred(m) or time.time() > deadline:
                return m
            time.sleep(0.1)


def parse_metrics(text):
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, value = line.rsplit(" ", 1)
        if "{" in name:
            base, labels = name.split("{", 1)
            labels = dict(kv.split("=", 1) for kv in labels.rstrip("}").split(","))
            labels = {k: v.strip('"') for k, v in labels.items()}
            labels.pop("model_name", None)
            if labels:
                base += "{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}"
            name = base
        out[name] = float(value)
    return out


def check_no_sanitizer_report(stderr_text):
    for marker in SANITIZER_MARKERS:
        assert marker not in stderr_text, f"sanitizer report in the server's stderr:\n{stderr_text[-8000:]}"


# ---- OpenAI schema validation ----

def _openapi_nullable(node):
    """OpenAPI 3.0's `nullable: true` (still used in places of this 3.1 file) means the type also
    admits null; plain JSON Schema ignores the keyword, so rewrite it into the type list."""
    if isinstance(node, dict):
        node = {k: _openapi_nullable(v) for k, v in node.items()}
        if node.pop("nullable", False) is True:
            if "enum" in node and None not in node["enum"]:
                node["enum"] = node["enum"] + [None]
            t = node.get("type")
            if isinstance(t, str):
                node["type"] = [t, "null"]
            elif isinstance(t, list) and "null" not in t:
                node["type"] = t + ["null"]
            elif "$ref" in node or "anyOf" in node or "allOf" in node or "oneOf" in node:
                node = {"anyOf": [node, {"type": "null"}]}
        return node
    if isinstance(node, list):
        return [_openapi_nullable(v) for v in node]
    return node


@functools.lru_cache(maxsize=1)
def _openapi():
    import yaml
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(OPENAPI) as f:
        return _openapi_nullable(yaml.load(f, Loader=loader))


@functools.lru_cache(maxsize=1)
def _openapi_with_stream_chunk():
    """Adds CompletionStreamChunk: the file says a streamed completion chunk has the shape of
    CreateCompletionResponse, whose choices[].finish_reason is a required non-null string; but
    every chunk before the last carries "finish_reason": null on the wire (OpenAI's own API does,
    and clients stop on the first non-null one). That one field is made nullable, nothing else."""
    import copy
    doc = copy.deepcopy(_openapi())
    chunk = copy.deepcopy(doc["components"]["schemas"]["CreateCompletionResponse"])
    props = chunk["properties"]["choices"]["items"]["properties"]
    props["finish_reason"] = {"anyOf": [props["finish_reason"], {"type": "null"}]}
    doc["components"]["schemas"]["CompletionStreamChunk"] = chunk
    return doc


@functools.lru_cache(maxsize=None)
def _validator(schema_name):
    import jsonschema
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012
    doc = _openapi_with_stream_chunk()
    assert schema_name in doc["components"]["schemas"], schema_name
    uri = "urn:openai-openapi"
    registry = Registry().with_resource(uri, Resource(contents=doc, specification=DRAFT202012))
    return jsonschema.Draft202012Validator({"$ref": f"{uri}#/components/schemas/{schema_name}"},
                                           registry=registry)


def validate(body, schema_name):
    """Raises jsonschema.ValidationError (with the path) if body does not match the schema."""
    if isinstance(body, (str, bytes)):
        body = json.loads(body)
    errors = sorted(_validator(schema_name).iter_errors(body), key=lambda e: list(e.path))
    assert not errors, f"{schema_name}: " + "; ".join(
        f"{list(e.path)}: {e.message[:300]}" for e in errors[:5]) + f"\nbody: {json.dumps(body)[:2000]}"


def sse_events(lines):
    """Yields the JSON objects of an SSE stream (iterable of text lines) and finally the string
    '[DONE]'. Asserts the framing is OpenAI's: 'data: ' lines separated by blank lines."""
    for line in lines:
        if isinstance(line, bytes):
            line = line.decode()
        if not line:
            continue
        assert line.startswith("data: "), f"not an SSE data line: {line!r}"
        data = line[len("data: "):]
        if data == "[DONE]":
            yield "[DONE]"
            return
        yield json.loads(data)
