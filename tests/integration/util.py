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


def run_pagoda(*args, input=None, check=True, timeout=600):
    """Runs the pagoda binary; returns the CompletedProcess (stdout/stderr as bytes)."""
    cmd = [str(PAGODA)] + [str(a) for a in args]
    p = subprocess.run(cmd, input=input, capture_output=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{cmd} exited {p.returncode}: {p.stderr.decode(errors='replace')}")
    return p
