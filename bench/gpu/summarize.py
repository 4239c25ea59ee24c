"""The GPU check's figures against issue 7's targets, from check.sh's results file(s): one JSON
object per line in, one per line out (appended by check.sh to its results file).
    python3 bench/gpu/summarize.py RESULTS.txt [MORE.txt ...]
Rows read: bandwidth (copy kernel GB/s), gemm (cuBLASLt TFLOP/s), decode and prefill (the runs
with no PAGODA_* switch set: the median of them, by tok_s, with their count; where every decode
run has one, as when the caller exported a PAGODA_* variable, the runs of the most common
variant, named in a "summary_variant" line), hf_decode / hf_prefill."""
import collections
import json
import sys

rows = []
for path in sys.argv[1:]:
    for line in open(path):
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass


def first(bench, **match):
    return next((r for r in rows if r.get("bench") == bench and
                 all(r.get(k) == v for k, v in match.items())), None)


# gpu_bench tags a figure with every PAGODA_* variable it ran under: one exported by the caller
# tags them all, and the default ("") would then select nothing and the summary come out empty
# without a word. The most common variant of the decode runs stands in for it (ties: the first
# seen), and the summary says so.
decode_variants = collections.Counter(r.get("variant", "") for r in rows
                                      if r.get("bench") == "decode")
base_variant = ""
if decode_variants and "" not in decode_variants:
    base_variant = decode_variants.most_common(1)[0][0]


def median(bench, variant=None, **match):
    """The run of median tok_s (the lower middle one of an even count) of the variant (the base
    one by default), with "runs" (how many) and "tok_s_runs" added; files before the variant
    field: the first run."""
    want = base_variant if variant is None else variant
    rs = [r for r in rows if r.get("bench") == bench and r.get("variant", "") == want and
          all(r.get(k) == v for k, v in match.items())]
    if not any("variant" in r for r in rs):
        rs = rs[:1]
    if not rs:
        return None
    rs = sorted(rs, key=lambda r: r["tok_s"])
    m = dict(rs[(len(rs) - 1) // 2])
    m["runs"], m["tok_s_runs"] = len(rs), [r["tok_s"] for r in rs]
    return m


out = []
if base_variant:
    out.append({"bench": "summary_variant", "variant": base_variant,
                "note": "no decode run without PAGODA_* variables: the figures below are the "
                        "runs of variant " + base_variant})
bw, gemm, d1 = first("bandwidth"), first("gemm"), median("decode", batch=1)
if bw and d1:
    roof_ms = d1["weight_bytes"] / (bw["GBps"] * 1e9) * 1e3
    out.append({"bench": "roofline", "weight_GB": d1["weight_bytes"] / 1e9, "GBps": bw["GBps"],
                "roofline_step_ms": roof_ms, "step_ms": d1["step_ms"],
                "fraction_of_roofline": roof_ms / d1["step_ms"], "runs": d1["runs"],
                "step_ms_runs": [1e3 / t for t in d1["tok_s_runs"]],  # batch 1: a token a step
                "target": 0.80})
pre = median("prefill")
if gemm and pre:
    tf = pre["gflop"] / (pre["ms"] / 1e3) / 1e3
    out.append({"bench": "prefill_roofline", "TFLOPs": tf, "gemm_TFLOPs": gemm["TFLOPs"],
                "fraction_of_gemm_peak": tf / gemm["TFLOPs"], "runs": pre["runs"],
                "tok_s_runs": pre["tok_s_runs"], "target": 0.50})
for bs in (1, 8, 64, 256):
    ours, hf = median("decode", batch=bs), first("hf_decode", batch=bs)
    if ours and hf:
        r = {"bench": "vs_transformers_decode", "batch": bs, "tok_s": ours["tok_s"],
             "runs": ours["runs"], "tok_s_runs": ours["tok_s_runs"], "hf_tok_s": hf["tok_s"],
             "ratio": ours["tok_s"] / hf["tok_s"]}
        if bs == 64:
            r["target"] = 5.0
        out.append(r)
hp = first("hf_prefill")
if pre and hp:
    out.append({"bench": "vs_transformers_prefill", "tokens": pre["tokens"],
                "tok_s": pre["tok_s"], "hf_tok_s": hp["tok_s"],
                "ratio": pre["tok_s"] / hp["tok_s"]})
# every other decode variant (a switch's A/B: PAGODA_CUDA_PDL=0, PAGODA_CUDA_GRAPHS=0, ...)
# against the base at the same batch size
for var in sorted(v for v in decode_variants if v != base_variant):
    for bs in sorted({r["batch"] for r in rows if r.get("bench") == "decode" and
                      r.get("variant", "") == var}):
        a, b = median("decode", var, batch=bs), median("decode", batch=bs)
        if a and b:
            out.append({"bench": "variant_vs_base", "variant": var, "batch": bs,
                        "tok_s": a["tok_s"], "runs": a["runs"], "base_tok_s": b["tok_s"],
                        "base_runs": b["runs"], "ratio": a["tok_s"] / b["tok_s"]})
for r in out:
    if "target" in r:
        v = r.get("fraction_of_roofline", r.get("fraction_of_gemm_peak", r.get("ratio")))
        r["meets_target"] = v >= r["target"]
    print(json.dumps(r))
