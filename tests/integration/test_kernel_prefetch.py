"""The decode tiles keep their software prefetch (issue 3).

Decode of quantized weights ran 1.5-2x slower without it (bench/RESULTS.md), and GCC 12 deletes
`_mm_prefetch` inside a helper it judges pure unless the helper is always_inline: a refactor can
drop every prefetch without changing a single result. Speed is not measured in tests (shared,
noisy machines), so this checks the compiled instructions instead: each weight-streaming decode
tile (4 rows x 1 token) of the release binary contains prefetcht0. Skipped where objdump is
missing or the binary is not an x86-64 AVX2 build.
"""
import shutil
import subprocess

import pytest

import util

# One tile per kernel family: F32-activation tiles (legacy and K-quants), int8 tiles, float tiles.
TILES = ["fa_q8_0_4_1", "fa_q4_1_4_1", "fa_q4_k_4_1", "fa_q6_k_4_1", "tiles_q8_0_4_1",
         "tiles_q4_1_4_1", "tiles_f16_4_1", "tiles_bf16_4_1"]


def _disassembly():
    if not shutil.which("objdump"):
        pytest.skip("objdump not installed")
    assert util.PAGODA.exists(), f"build pagoda first: {util.PAGODA} is missing"
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(util.PAGODA)],
                         capture_output=True, text=True, check=True).stdout
    funcs, name = {}, None
    for line in out.splitlines():
        if line.endswith(">:"):
            name = line.split("<", 1)[1][:-2]
            funcs[name] = []
        elif name and line.strip():
            funcs[name].append(line)
    return funcs


def test_decode_tiles_prefetch():
    funcs = _disassembly()
    if "fa_q8_0_4_1" not in funcs:
        pytest.skip("not an AVX2 build (the portable build has no register tiles)")
    for tile in TILES:
        assert tile in funcs, f"{tile} is not in {util.PAGODA} (renamed? update this test)"
        body = funcs[tile]
        n = sum("prefetcht0" in line for line in body)
        assert n > 0, f"{tile}: no prefetcht0 in its {len(body)} instructions"
