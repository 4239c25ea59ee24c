import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import util  # noqa: E402


@pytest.fixture(scope="session")
def pagoda_bin():
    assert util.PAGODA.exists(), f"build pagoda first: {util.PAGODA} is missing"
    return util.PAGODA


@pytest.fixture(scope="session")
def default_model():
    assert util.DEFAULT_MODEL.exists(), "run scripts/fetch-default-model.sh first"
    return util.DEFAULT_MODEL


@pytest.fixture(scope="module")
def default_server(default_model):
    """`pagoda serve` on the default model, one per test module."""
    from server_util import Server
    s = Server(default_model)
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def random_server():
    """`pagoda serve` on the tiny random-weight Llama 2 (the real 32k vocabulary), one per test
    module: sampled answers that wander over the whole vocabulary."""
    from server_util import Server
    s = Server(util.DATA / "models" / "llama-2-tiny-random.gguf")
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def smol(default_server):
    """The default model's server, by its short name."""
    return default_server


@pytest.fixture(scope="module")
def rnd(random_server):
    """The random model's server, by its short name."""
    return random_server


@pytest.fixture(scope="session")
def tiny_models():
    """Builds (once per script version, cached) the tiny random Llama / Llama-3-rope / Qwen2
    models of make_tiny_models.py; returns {name: {arch, hf_dir, gguf_F32, gguf_F16, gguf_Q8_0}}."""
    import json
    import subprocess

    script = Path(__file__).parent / "make_tiny_models.py"
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, f"make_tiny_models.py failed:\n{p.stderr}"
    return json.loads(p.stdout.strip().splitlines()[-1])
