#!/usr/bin/env python3
"""Greedy and arg-max agreement of 8-bit against F32 activations on K-quant weights (issue 37).

The random dim-256 Llama of tests/integration/test_quant_models.py, its 16 matrices in K-quants
only (Q4_K and Q6_K, as Q4_K_M files; or --types), through `pagoda logits` (teacher-forced
arg-max agreement per position, and the max |logit difference| over the largest |logit|) and
`pagoda generate --temperature 0` (token-for-token agreement of N_GEN greedy tokens) with
PAGODA_INT8_ACT=0 and =1, on several random prompts. Random weights: a check of how often the
activation rounding flips a choice, not of quality on text (that needs perplexity / KL on a
real file).

  PAGODA_BUILD=build python bench/kq_int8_agreement.py [--prompts 8] [--types Q4_K Q6_K]
(needs torch, transformers and gguf, as the integration tests)
"""
import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))
import test_quant_models as tqm  # noqa: E402
import util  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--types", nargs="+", default=["Q4_K", "Q6_K"])
    a = ap.parse_args()
    types = [getattr(tqm.T, t) for t in a.types]
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        m = tqm.Mixed(d, types=types, name="kquant")
        rng = np.random.default_rng(5)
        pos_same = pos_all = gen_same = gen_all = seq_same = 0
        worst = 0.0
        for i in range(a.prompts):
            ids = rng.integers(3, 32000, size=tqm.N_PROMPT).tolist()
            lg, gen = {}, {}
            for mode in ("0", "1"):
                env = dict(os.environ, PAGODA_INT8_ACT=mode)
                lg[mode] = tqm.pagoda_logits(m, ids, d, env=env)
                p = util.run_pagoda("generate", "-m", m.path, "--ids", " ".join(map(str, ids)),
                                    "-n", a.gen, "--temperature", "0", "--ignore-eos",
                                    "--print-ids", env=env)
                gen[mode] = [int(x) for x in p.stdout.split()]
            pos_same += int(np.sum(lg["0"].argmax(1) == lg["1"].argmax(1)))
            pos_all += len(ids)
            worst = max(worst, float(np.abs(lg["0"] - lg["1"]).max() / np.abs(lg["0"]).max()))
            n = next((k for k, (x, y) in enumerate(zip(gen["0"], gen["1"])) if x != y),
                     len(gen["0"]))
            gen_same += n
            gen_all += len(gen["0"])
            seq_same += gen["0"] == gen["1"]
        print(f"types {' '.join(a.types)}: teacher-forced arg-max agreement {pos_same}/{pos_all} "
              f"({pos_same / pos_all:.1%}), max |logit diff| / max |logit| {worst:.2e}; greedy: "
              f"{seq_same}/{a.prompts} sequences identical, {gen_same}/{gen_all} tokens before "
              f"the first difference")


if __name__ == "__main__":
    main()
