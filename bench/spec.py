#!/usr/bin/env python3
"""Decode speed-up of n-gram speculative decoding (issue 6), on SmolLM2-135M-Instruct.

Workloads, through the model's chat template (<|im_start|>user ... <|im_end|> <|im_start|>assistant):
  repetitive  "repeat this passage" over a ~500-token passage: the answer copies the prompt,
              which is what prompt lookup exploits;
  free-form   open questions: little to copy.
Each at batch 1 and batch 16 (16 requests submitted at once), greedy, with and without
`--speculative ngram`; decode throughput = generated tokens / wall time of `pagoda batch`
(prefill included in both, so the speed-up is conservative), median of --runs runs.
Not a test: prints a Markdown table (and --json) to paste into bench/RESULTS.md.

usage: bench/spec.py [--pagoda build/pagoda] [--model M] [--runs 3] [--max-tokens 256]
                     [--batches 1,16] [--threads 2] [--k 5]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PASSAGE = (
    "The lighthouse stood at the northern tip of the island, where the cliffs fell straight into "
    "the sea. For more than a hundred years it had guided fishing boats home through fog and "
    "storm. The keeper, an old man named Elias, climbed its spiral stairs every evening at dusk "
    "to light the great lamp. He polished the brass fittings, trimmed the wick, and wound the "
    "clockwork that turned the lens. In winter the wind howled around the tower and salt spray "
    "crusted the windows, but the light never failed. Elias kept a logbook in which he wrote the "
    "weather, the ships he saw, and the small events of his days: a seal on the rocks, a storm "
    "petrel sheltering on the gallery, a letter from his daughter on the mainland. When the "
    "government decided to automate the lighthouse, engineers arrived with crates of equipment. "
    "They installed an electric lamp, a timer, and a radio beacon, and they told Elias that he "
    "could stay in the cottage for as long as he wished. He thanked them, but every evening he "
    "still climbed the stairs, not because the light needed him, but because he could not "
    "imagine the dusk without that climb. The villagers said that on clear nights they could "
    "see a small second light moving up the tower just before the great one came on: the old "
    "keeper's lantern, still making its rounds. Years later, when Elias died, his daughter found "
    "the logbooks stacked in the cottage, forty volumes in a neat row. She read them through the "
    "winter and then gave them to the village library, where children still ask to see the page "
    "on which he wrote, in careful letters, that the sea had been calm and the light had burned "
    "all night, as it always should. "
)

FREE = [
    "Write a short story about a robot who learns to paint.",
    "Explain how photosynthesis works to a ten-year-old.",
    "What are the main causes of the French Revolution?",
    "Give me some tips for learning a new language.",
    "Describe a day in the life of a medieval blacksmith.",
    "Why is the sky blue? Explain in simple words.",
    "Write a poem about the ocean at night.",
    "What should I pack for a week-long hiking trip?",
]

REPEAT = [
    "Repeat the following passage exactly, word for word:\n\n",
    "Copy this text exactly as it is:\n\n",
    "Please rewrite the passage below without changing anything:\n\n",
    "Reproduce the following text verbatim:\n\n",
]


def chat(user):
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def requests(kind, n, max_tokens):
    out = []
    for i in range(n):
        if kind == "repetitive":
            user = REPEAT[i % len(REPEAT)] + PASSAGE
        else:
            user = FREE[i % len(FREE)]
        out.append({"id": i, "prompt": chat(user), "max_tokens": max_tokens, "temperature": 0})
    return out


def run(args, reqs, spec, tmp):
    inp, outp, stats = (Path(tmp) / f for f in ("in.jsonl", "out.jsonl", "stats.json"))
    inp.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    cmd = [args.pagoda, "batch", "-m", args.model, "--input", str(inp), "--output", str(outp),
           "--stats", str(stats), "--no-progress", "-t", str(args.threads),
           "--max-num-seqs", str(len(reqs))]
    if spec:
        cmd += ["--speculative", "ngram", "--num-speculative-tokens", str(args.k)]
    subprocess.run(cmd, check=True, capture_output=True)
    st = json.loads(stats.read_text())
    res = [json.loads(l) for l in outp.read_text().splitlines()]
    return st, [r["token_ids"] for r in res]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagoda", default=str(ROOT / "build" / "pagoda"))
    ap.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--workloads", default="repetitive,free-form")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.workloads.split(","):
            for bs in [int(b) for b in args.batches.split(",")]:
                reqs = requests(kind, bs, args.max_tokens)
                tps = {False: [], True: []}
                acc = None
                for r in range(args.runs):
                    outs = {}
                    for spec in (False, True):
                        st, outs[spec] = run(args, reqs, spec, tmp)
                        tps[spec].append(st["generation_tokens"] / st["seconds"])
                        if spec:
                            acc = st
                    same = outs[False] == outs[True]
                    print(f"{kind} batch {bs} run {r + 1}: {tps[False][-1]:.1f} -> "
                          f"{tps[True][-1]:.1f} tok/s, outputs identical: {same}",
                          file=sys.stderr, flush=True)
                base, spec = statistics.median(tps[False]), statistics.median(tps[True])
                rate = acc["spec_accepted_tokens"] / max(1, acc["spec_draft_tokens"])
                per = acc["spec_accepted_tokens"] / max(1, acc["spec_drafts"])
                rows.append(dict(workload=kind, batch=bs, base_tps=base, spec_tps=spec,
                                 speedup=spec / base, acceptance=rate, accepted_per_verify=per,
                                 gen_tokens=acc["generation_tokens"], identical=same))
    print("| workload | batch | tok/s plain | tok/s n-gram | speed-up | acceptance | "
          "accepted / verification |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['workload']} | {r['batch']} | {r['base_tps']:.1f} | {r['spec_tps']:.1f} | "
              f"{r['speedup']:.2f}x | {100 * r['acceptance']:.0f}% | "
              f"{r['accepted_per_verify']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
