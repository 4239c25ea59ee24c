#!/usr/bin/env python3
"""llama.cpp on the same GGUF file and machine as `pagoda bench`: the baseline for issue 3.

Runs llama.cpp (the `llama-cpp-python` package, which compiles llama.cpp from source at install
time, through its C API bindings) the way `pagoda bench` runs Pagoda, and prints the same keys:
  ppP     one prompt of P random tokens in one llama_decode (logits for the last), tokens/s;
  tgN     N decode steps of one sequence after a 1-token prompt, tokens/s;
  batchB  B sequences get one token each at position 0, then 16 steps of B tokens (one per
          sequence, all with logits), tokens/s over those 16 steps.
Median of R repetitions after one warm-up, T threads, a fresh context (empty KV cache) per
repetition. Wall time around llama_decode alone.

  python3 -m venv ~/.cache/pagoda/venv-llamacpp
  CMAKE_ARGS="-DGGML_NATIVE=ON" ~/.cache/pagoda/venv-llamacpp/bin/pip install llama-cpp-python
  ~/.cache/pagoda/venv-llamacpp/bin/python bench/llamacpp_baseline.py -m MODEL.gguf \\
      [-p 512] [-n 128] [-t 2] [-r 3] [--batch 16,64] [--json]

Not run by CI (its install compiles llama.cpp for ~10 minutes on 2 cores). bench/vs_llamacpp.py
runs it alternately with `pagoda bench`.
"""
import argparse
import json
import random
import statistics
import sys
import time

import llama_cpp as L

BATCH_STEPS = 16  # as pagoda bench


class Runner:
    def __init__(self, path, threads):
        L.llama_backend_init()
        self.model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"{path}: llama.cpp could not load the model")
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.threads = threads
        self.rng = random.Random(0)

    def context(self, n_ctx, n_batch, n_seq):
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = cp.n_ubatch = n_batch
        cp.n_seq_max = n_seq
        cp.n_threads = cp.n_threads_batch = self.threads
        ctx = L.llama_init_from_model(self.model, cp)
        if not ctx:
            raise RuntimeError("llama.cpp could not create a context")
        return ctx

    def decode(self, ctx, batch, toks, pos, seqs, logits):
        batch.n_tokens = len(toks)
        for i, (t, p, s, lg) in enumerate(zip(toks, pos, seqs, logits)):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, p, 1, lg
            batch.seq_id[i][0] = s
        t0 = time.perf_counter()
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        return time.perf_counter() - t0

    def tok(self):
        return self.rng.randrange(self.n_vocab)

    def prefill(self, p):
        ctx = self.context(p + 16, p, 1)
        batch = L.llama_batch_init(p, 0, 1)
        dt = self.decode(ctx, batch, [self.tok() for _ in range(p)], range(p), [0] * p,
                         [0] * (p - 1) + [1])
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        return p / dt

    def steps(self, bsz, n_steps):
        """bsz sequences, one token each at position 0, then n_steps timed steps."""
        ctx = self.context(bsz * (n_steps + 8), max(bsz, 32), bsz)
        batch = L.llama_batch_init(bsz, 0, bsz)
        elapsed = 0.0
        for step in range(n_steps + 1):
            dt = self.decode(ctx, batch, [self.tok() for _ in range(bsz)], [step] * bsz,
                             range(bsz), [1] * bsz)
            if step > 0:
                elapsed += dt
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        return bsz * n_steps / elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-p", type=int, default=512, help="prompt tokens (0: skip pp)")
    ap.add_argument("-n", type=int, default=128, help="decode steps (0: skip tg)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--batch", default="", help="comma-separated B for batchB")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.reps < 1:
        ap.error("-r must be at least 1")

    run = Runner(a.model, a.threads)
    res = {"engine": "llama.cpp", "llama_cpp_python": getattr(L, "__version__", "?"),
           "system_info": L.llama_print_system_info().decode().strip(), "model": a.model,
           "threads": a.threads, "reps": a.reps, "results": []}
    tests = []
    if a.p:
        tests.append((f"pp{a.p}", lambda: run.prefill(a.p)))
    if a.n:
        tests.append((f"tg{a.n}", lambda: run.steps(1, a.n)))
    for b in [int(v) for v in a.batch.split(",") if v]:
        tests.append((f"batch{b}", lambda b=b: run.steps(b, BATCH_STEPS)))
    for name, fn in tests:
        runs = [fn() for _ in range(a.reps + 1)][1:]  # the first warms up
        res["results"].append({"test": name, "tokens_per_s": statistics.median(runs),
                               "runs": runs})
    if a.json:
        print(json.dumps(res))
    else:
        for r in res["results"]:
            print(f"{r['test']:10s} {r['tokens_per_s']:10.2f} t/s  runs "
                  + " ".join(f"{v:.2f}" for v in r["runs"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
