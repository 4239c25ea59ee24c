"""Encoders for the ggml block formats gguf-py reads but cannot write (gguf.quants only quantizes
F16/BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS.

They are plain round-to-nearest encoders, not llama.cpp's error-minimizing searches: what the
tests need is valid blocks whose values are close to the weights, and gguf.quants.dequantize
(the reference decoder) says what those values are. Every block depends only on its own
elements, so encoding commutes with permuting rows (the converter's Q/K permutation).
`encode(a, qtype)` returns uint8 rows of whole blocks, as gguf.quants.quantize does.
"""
import numpy as np
from gguf import GGMLQuantizationType as T

# IQ4_NL's grid (ggml's kvalues_iq4nl; gguf.quants.IQ4_NL.kvalues)
IQ4_GRID = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                    np.float32)


def _f16(v):
    """(fp16 bytes (..., 2), the fp16 value as float32)."""
    h = np.asarray(v, np.float32).astype(np.float16)
    return h[..., None].view(np.uint8), h.astype(np.float32)


def _div(x, d):
    """x / d, 0 where d is 0."""
    d = np.broadcast_to(d, np.broadcast_shapes(np.shape(x), np.shape(d)))
    return np.divide(x, d, out=np.zeros(d.shape, np.float32), where=d != 0)


def _round(x, lo, hi):
    return np.clip(np.rint(x), lo, hi).astype(np.int16)


def _signed_absmax(x):
    """The element of largest magnitude along the last axis, sign kept."""
    return np.take_along_axis(x, np.abs(x).argmax(-1)[..., None], -1)[..., 0]


def _nibbles(lo, hi):
    return (lo & 0xF) | (hi & 0xF) << 4


def _iq4_index(x, dl):
    """Nearest IQ4 grid index of x / dl."""
    return np.abs(_div(x, dl)[..., None] - IQ4_GRID).argmin(-1).astype(np.uint8)


def _iq4_nl(b):  # (nb, 32): fp16 d | qs[16]
    d, df = _f16(_signed_absmax(b) / -127.0)
    q = _iq4_index(b, df[:, None])
    return [d, _nibbles(q[:, :16], q[:, 16:])]


def _iq4_xs(b):  # (nb, 256): fp16 d | u16 scales_h | scales_l[4] | qs[128]
    s = b.reshape(-1, 8, 32)
    dl_want = _signed_absmax(s) / -127.0
    d, df = _f16(np.abs(dl_want).max(-1) / 31.0)
    ls = (_round(_div(dl_want, df[:, None]), -32, 31) + 32).astype(np.uint16)
    q = _iq4_index(s, (df[:, None] * (ls.astype(np.float32) - 32))[..., None])
    sh = (((ls >> 4) & 3) << (2 * np.arange(8, dtype=np.uint16))).sum(-1).astype(np.uint16)
    sl = _nibbles(ls[:, 0::2], ls[:, 1::2]).astype(np.uint8)
    return [d, sh[:, None].view(np.uint8), sl,
            _nibbles(q[..., :16], q[..., 16:]).reshape(-1, 128)]


def _pack_2bit(q):
    """2-bit values in element order (nb, 256) -> qs[64]: per 128-element half, shift s holds
    elements 32 s .. 32 s + 31 at bytes 0..31 of the half."""
    v = q.reshape(-1, 2, 4, 32)
    return sum(v[:, :, s] << (2 * s) for s in range(4)).reshape(-1, 64)


def _q2_k(b):  # scales[16] | qs[64] | fp16 d | fp16 dmin; value d*sc*q - dmin*m
    g = b.reshape(-1, 16, 16)
    lo = np.minimum(g.min(-1), 0)
    scale, mn = (g.max(-1) - lo) / 3.0, -lo
    d, df = _f16(scale.max(-1) / 15.0)
    dm, dmf = _f16(mn.max(-1) / 15.0)
    sc = _round(_div(scale, df[:, None]), 0, 15)
    m = _round(_div(mn, dmf[:, None]), 0, 15)
    dl, ml = df[:, None] * sc, dmf[:, None] * m
    q = _round(_div(g + ml[..., None], dl[..., None]), 0, 3)
    return [_nibbles(sc, m).astype(np.uint8), _pack_2bit(q), d, dm]


def _q3_k(b):  # hmask[32] | qs[64] | scales[12] | fp16 d; value d*(sc-32)*(q-4)
    g = b.reshape(-1, 16, 16)
    s = np.abs(g).max(-1) / 4.0
    d, df = _f16(s.max(-1) / 31.0)
    sc = _round(_div(s, df[:, None]), 0, 31)
    u = (_round(_div(g, (df[:, None] * sc)[..., None]), -4, 3) + 4).reshape(-1, 256)
    hbit = (u >> 2).reshape(-1, 2, 4, 32)  # half, shift, byte
    hmask = sum(hbit[:, h, s] << (4 * h + s) for h in range(2) for s in range(4))
    v = sc + 32  # 6-bit: low nibbles in bytes 0..7, high pairs in bytes 8..11
    scales = np.concatenate([_nibbles(v[:, :8], v[:, 8:]),
                             sum(((v[:, 4 * r:4 * r + 4] >> 4) & 3) << (2 * r) for r in range(4))],
                            axis=1).astype(np.uint8)
    return [hmask.astype(np.uint8), _pack_2bit(u & 3), scales, d]


def _k4_scales(sc, m):
    """8 six-bit scales and mins -> Q4_K/Q5_K's 12 bytes (ggml's get_scale_min_k4 layout)."""
    return np.concatenate([(sc[:, :4] & 63) | (sc[:, 4:] >> 4) << 6,
                           (m[:, :4] & 63) | (m[:, 4:] >> 4) << 6,
                           (sc[:, 4:] & 0xF) | (m[:, 4:] & 0xF) << 4], axis=1).astype(np.uint8)


def _q45_k(b, bits):  # fp16 d | fp16 dmin | scales[12] | (Q5_K: qh[32]) | qs[128]
    s = b.reshape(-1, 8, 32)
    top = (1 << bits) - 1
    lo = np.minimum(s.min(-1), 0)
    scale, mn = (s.max(-1) - lo) / top, -lo
    d, df = _f16(scale.max(-1) / 63.0)
    dm, dmf = _f16(mn.max(-1) / 63.0)
    sc = _round(_div(scale, df[:, None]), 0, 63)
    m = _round(_div(mn, dmf[:, None]), 0, 63)
    q = _round(_div(s + (dmf[:, None] * m)[..., None], (df[:, None] * sc)[..., None]), 0, top)
    qs = _nibbles(q[:, 0::2], q[:, 1::2]).reshape(-1, 128)  # sub-blocks 2j, 2j+1 share bytes
    out = [d, dm, _k4_scales(sc, m)]
    if bits == 5:
        out.append(sum((q[:, k] >> 4) << k for k in range(8)).astype(np.uint8))
    return out + [qs.astype(np.uint8)]


def _q6_k(b):  # ql[128] | qh[64] | int8 scales[16] | fp16 d; value d*sc*(q-32)
    g = b.reshape(-1, 16, 16)
    s = np.abs(g).max(-1) / 32.0
    d, df = _f16(s.max(-1) / 127.0)
    sc = _round(_div(s, df[:, None]), 0, 127)
    v = (_round(_div(g, (df[:, None] * sc)[..., None]), -32, 31) + 32).reshape(-1, 2, 4, 32)  # half c, quarter k, element l
    ql = np.concatenate([_nibbles(v[:, :, 0], v[:, :, 2]), _nibbles(v[:, :, 1], v[:, :, 3])],
                        axis=2).reshape(-1, 128)
    qh = sum(((v[:, :, k] >> 4) & 3) << (2 * k) for k in range(4)).reshape(-1, 64)
    return [ql.astype(np.uint8), qh.astype(np.uint8), sc, d]


ENCODERS = {T.IQ4_NL: (32, _iq4_nl), T.IQ4_XS: (256, _iq4_xs), T.Q2_K: (256, _q2_k),
            T.Q3_K: (256, _q3_k), T.Q4_K: (256, lambda b: _q45_k(b, 4)),
            T.Q5_K: (256, lambda b: _q45_k(b, 5)), T.Q6_K: (256, _q6_k)}


def encode(a, qtype):
    """a (rows, n), float32, n a multiple of the block -> uint8 (rows, n / block * block bytes).
    Types gguf.quants writes itself go to gguf.quants.quantize."""
    import gguf
    a = np.ascontiguousarray(a, np.float32)
    if qtype not in ENCODERS:
        return gguf.quants.quantize(a, qtype)
    block, fn = ENCODERS[qtype]
    assert a.shape[-1] % block == 0, (a.shape, qtype)
    parts = fn(a.reshape(-1, block))
    raw = np.concatenate([p.reshape(p.shape[0], -1).astype(np.uint8) for p in parts], axis=1)
    assert raw.shape[1] == gguf.constants.GGML_QUANT_SIZES[qtype][1], (qtype, raw.shape)
    return raw.reshape(*a.shape[:-1], -1)
