"""Pagoda's CPU dequantization and dot products against gguf-py, the Python reference of the
ggml block formats (gguf.quants). Runs tests/tools/pgd_quant_tool from the build folder."""
import subprocess

import numpy as np
import pytest

import util

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf.constants import GGML_QUANT_SIZES  # noqa: E402

TOOL = util.BUILD / "pgd_quant_tool"

# byte offsets of the fp16 scale fields per block: random bytes there are replaced with finite
# fp16 values so the comparison is about the layout, not about inf/NaN arithmetic.
SCALE_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q8_0: [0],
    T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.Q5_0: [0], T.Q5_1: [0, 2], T.IQ4_NL: [0], T.Q2_K: [80, 82], T.Q3_K: [108], T.IQ4_XS: [0],
}
QUANTIZABLE = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1]  # gguf.quants.quantize implements these
# gguf.quants only dequantizes these: random blocks stand in for quantized weights
KQUANTS = [T.Q4_K, T.Q5_K, T.Q6_K, T.Q2_K, T.Q3_K, T.IQ4_NL, T.IQ4_XS]


@pytest.fixture(scope="module")
def tool():
    assert TOOL.exists(), f"build pgd_quant_tool first: {TOOL} is missing"
    return TOOL


def run_tool(tool, *args):
    p = subprocess.run([str(tool)] + [str(a) for a in args], capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode(errors="replace")


def pagoda_dequant(tool, tmp_path, qtype, blocks: np.ndarray) -> np.ndarray:
    src, dst = tmp_path / "in.bin", tmp_path / "out.f32"
    src.write_bytes(np.ascontiguousarray(blocks, dtype=np.uint8).tobytes())
    run_tool(tool, "dequant", qtype.name, src, dst)
    return np.frombuffer(dst.read_bytes(), dtype=np.float32)


def random_blocks(rng, qtype, n_blocks, scale=0.05):
    _, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for off in SCALE_FIELDS[qtype]:
        d = (rng.standard_normal(n_blocks) * scale).astype(np.float16)
        raw[:, off:off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    return raw


def assert_same_bits(got: np.ndarray, want: np.ndarray):
    want = np.asarray(want, dtype=np.float32).reshape(-1)
    assert got.shape == want.shape
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    bad = np.flatnonzero(got[~nan].view(np.uint32) != want[~nan].view(np.uint32))
    assert bad.size == 0, f"{bad.size} elements differ, first at {bad[0]}: " \
        f"{got[~nan][bad[0]]!r} vs {want[~nan][bad[0]]!r}"


@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda t: t.name)
def test_dequant_of_gguf_quantized(tool, tmp_path, qtype):
    rng = np.random.default_rng(1234 + int(qtype))
    x = rng.standard_normal((16, 1024)).astype(np.float32)
    x[3] *= 1e-3
    x[4, :64] = 0.0  # all-zero blocks (d = 0)
    x[5] *= 100.0
    q = gguf.quants.quantize(x, qtype)
    assert_same_bits(pagoda_dequant(tool, tmp_path, qtype, q), gguf.quants.dequantize(q, qtype))


@pytest.mark.parametrize("qtype", QUANTIZABLE + KQUANTS, ids=lambda t: t.name)
def test_dequant_of_random_bytes(tool, tmp_path, qtype):
    rng = np.random.default_rng(99 + int(qtype))
    for scale in (0.05, 1e-4, 100.0):
        raw = random_blocks(rng, qtype, 64, scale)
        assert_same_bits(pagoda_dequant(tool, tmp_path, qtype, raw),
                         gguf.quants.dequantize(raw, qtype))


def test_dequant_f16_all_patterns(tool, tmp_path):
    bits = np.arange(65536, dtype=np.uint16)
    got = pagoda_dequant(tool, tmp_path, T.F16, bits.view(np.uint8))
    assert_same_bits(got, gguf.quants.dequantize(bits.view(np.uint8), T.F16))


def test_dequant_bf16_all_patterns(tool, tmp_path):
    bits = np.arange(65536, dtype=np.uint16)
    got = pagoda_dequant(tool, tmp_path, T.BF16, bits.view(np.uint8))
    want = gguf.quants.dequantize(bits.view(np.uint8).reshape(1, -1), T.BF16)
    # NaNs included: BF16 widening is a shift, so even NaN payloads must match bit for bit.
    want = np.asarray(want, np.float32).reshape(-1)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_dequant_bf16_of_gguf_quantized(tool, tmp_path):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(4096).astype(np.float32) * 3
    q = gguf.quants.quantize(x, T.BF16)
    assert_same_bits(pagoda_dequant(tool, tmp_path, T.BF16, q), gguf.quants.dequantize(q, T.BF16))


def test_dequant_f32(tool, tmp_path):
    x = np.random.default_rng(3).standard_normal(1000).astype(np.float32)
    assert_same_bits(pagoda_dequant(tool, tmp_path, T.F32, x.view(np.uint8)), x)


def test_dequant_q8_k(tool, tmp_path):
    # gguf-py has no Q8_K class; its layout is float d | int8 qs[256] | int16 bsums[16].
    rng = np.random.default_rng(11)
    nb = 8
    d = rng.standard_normal(nb).astype(np.float32)
    qs = rng.integers(-127, 128, size=(nb, 256), dtype=np.int8)
    bsums = qs.reshape(nb, 16, 16).sum(axis=2).astype(np.int16)
    raw = np.concatenate([d.view(np.uint8).reshape(nb, 4), qs.view(np.uint8),
                          bsums.view(np.uint8).reshape(nb, 32)], axis=1)
    assert raw.shape[1] == GGML_QUANT_SIZES[T.Q8_K][1]
    assert_same_bits(pagoda_dequant(tool, tmp_path, T.Q8_K, raw),
                     (d[:, None] * qs.astype(np.float32)).reshape(-1))


# Bytes that carry scales (kept) vs quants (zeroed by zero_quants), per block.
KEEP = {T.Q4_0: (0, 2), T.Q4_1: (0, 4), T.Q8_0: (0, 2), T.Q4_K: (0, 16), T.Q5_K: (0, 16),
        T.Q5_0: (0, 2), T.Q5_1: (0, 4), T.Q2_K: (0, 0), T.Q3_K: (96, 110)}


def zero_quants(qtype, w):
    """The weights with every quant set to 0: only the offset term (-8d, +m, -dmin*min,
    -32*d*sc) is left; 0 for float types and Q8_0.
    The IQ4 grids have no zero: their offset term is taken as 0 (each value is a product of
    the block scale and a grid value, no cancellation)."""
    block, size = GGML_QUANT_SIZES[qtype]
    if block == 1 or qtype in (T.IQ4_NL, T.IQ4_XS):
        return np.zeros_like(w)
    z = np.ascontiguousarray(w).reshape(-1, size).copy()
    if qtype == T.Q6_K:
        z[:, :192] = 0
    elif qtype == T.Q2_K:  # quants 0, scales and mins kept
        z[:, 16:80] = 0
    elif qtype == T.Q3_K:  # 2-bit quants 0 and the high bits clear: every value -4 * d * sc
        z[:, :96] = 0
    elif qtype in (T.Q5_0, T.Q5_1):  # 5-bit quants 0: -16 * d (Q5_0), m (Q5_1)
        z[:, KEEP[qtype][1]:] = 0
    else:
        lo, hi = KEEP[qtype]
        z[:, hi:] = 0
    return z.reshape(w.shape)


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.BF16] + QUANTIZABLE + KQUANTS,
                         ids=lambda t: t.name)
def test_dot_against_gguf_dequant(tool, tmp_path, qtype):
    """pgd_vec_dot of each row, against float64 dot(gguf dequant(row), activations).

    Tight check, against the activations as the kernel saw them (a = d_act * q_act, written by
    the tool): integer block products are exact, so only float rounding is left; with
    M = sum_i (|w_i - z_i| + |z_i|) * |a_i| (z: the offset term) and n_terms float terms,
    |got - w.a| <= (n_terms + 8) * eps * M (derivation in tests/unit/test_quant.c).
    Loose check, against x itself: |x_i - a_i| <= d_act/2 with d_act = amax(block)/127 adds
    sum_i |w_i| * d_act(i) / 2.
    """
    rng = np.random.default_rng(500 + int(qtype))
    rows, n = 8, 2048
    x = rng.standard_normal(n).astype(np.float32)
    if qtype == T.F32:
        w = rng.standard_normal((rows, n)).astype(np.float32).view(np.uint8)
    elif qtype == T.F16:
        w = rng.standard_normal((rows, n)).astype(np.float16).view(np.uint8)
    elif qtype == T.BF16:
        w = gguf.quants.quantize(rng.standard_normal((rows, n)).astype(np.float32), T.BF16)
    elif qtype in QUANTIZABLE:
        w = gguf.quants.quantize(rng.standard_normal((rows, n)).astype(np.float32) * 0.1, qtype)
    else:
        block, size = GGML_QUANT_SIZES[qtype]
        w = random_blocks(rng, qtype, rows * n // block, 0.01).reshape(rows, -1)
    w = np.ascontiguousarray(w)

    def deq(b):
        return np.asarray(gguf.quants.dequantize(b, qtype), np.float64).reshape(rows, n)

    wf, zf = deq(w), deq(zero_quants(qtype, w))

    (tmp_path / "w.bin").write_bytes(w.tobytes())
    (tmp_path / "x.f32").write_bytes(x.tobytes())
    run_tool(tool, "dot", qtype.name, tmp_path / "w.bin", tmp_path / "x.f32", tmp_path / "y.f32",
             tmp_path / "a.f32")
    got = np.frombuffer((tmp_path / "y.f32").read_bytes(), dtype=np.float32).astype(np.float64)
    a = np.frombuffer((tmp_path / "a.f32").read_bytes(), dtype=np.float32).astype(np.float64)

    eps = float(np.finfo(np.float32).eps)
    block = GGML_QUANT_SIZES[qtype][0]
    n_terms = n // block
    M = ((np.abs(wf - zf) + np.abs(zf)) * np.abs(a)).sum(axis=1)
    tol = (n_terms + 8) * eps * M + 1e-30
    assert np.all(np.abs(got - wf @ a) <= tol), (got - wf @ a, tol)

    if block > 1:
        amax = np.abs(x.reshape(-1, block if block == 256 else 32)).max(axis=1)
        dact = np.repeat(amax.astype(np.float64) / 127.0, block if block == 256 else 32)
        qerr = (np.abs(wf) * dact / 2).sum(axis=1) * (1 + 4 * eps)
        assert np.all(np.abs(got - wf @ x) <= qerr + tol)
    else:
        assert np.array_equal(a, x.astype(np.float64))


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_0])
def test_kv_quantizer_writes_ggml_reference_blocks(tool, tmp_path, qtype):
    """The quantized KV cache's writer (--kv-dtype q8_0 / q4_0) against gguf.quants.quantize,
    byte for byte: K/V-like rows (normal, with outliers, all-zero blocks, ties at .5 steps)."""
    rng = np.random.default_rng(38)
    rows = [rng.standard_normal(4096).astype(np.float32),
            (rng.standard_normal(4096) * 40).astype(np.float32),
            np.zeros(64, dtype=np.float32),
            np.repeat(np.arange(-8, 8, dtype=np.float32) * 0.5, 8),
            rng.standard_t(2, 4096).astype(np.float32)]
    x = np.concatenate(rows)
    src, dst = tmp_path / "in.f32", tmp_path / "out.bin"
    src.write_bytes(x.tobytes())
    run_tool(tool, "kvquant", qtype.name, src, dst)
    want = gguf.quants.quantize(x.reshape(1, -1), qtype).reshape(-1)
    got = np.frombuffer(dst.read_bytes(), dtype=np.uint8)
    assert got.shape == want.shape
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} bytes differ, first at {bad[:8]}"
