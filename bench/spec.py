#!/usr/bin/env python3
"""Decode speed-up of speculative decoding (issue 6), on SmolLM2-135M-Instruct.

Workloads, through the model's chat template (<|im_start|>user ... <|im_end|> <|im_start|>assistant):
  repetitive  "repeat this passage" over a ~500-token passage: the answer copies the prompt,
              which is what prompt lookup exploits;
  free-form   open questions: little to copy.
Each at every batch size of --batches (that many requests, or --requests, submitted at once to
`pagoda batch` with --max-num-seqs = batch; requests cycle through the prompts), greedy. For
each (workload, batch) and each of --runs runs, in an order that rotates from run to run:
  prefill-only  the same requests with max_tokens 1, no speculation;
  plain         no speculation;
  spec variant  `--speculative PROPOSER` plus each --spec-args string (one variant per string).
Times are the `seconds` of `pagoda batch --stats` (the engine loop: no model load, no tokenizer
start-up) for every run. Two throughputs:
  end-to-end   generated tokens / T_run (prefill included);
  decode-only  (generated - n_requests) / (T_run - T_prefill_only), with the prefill-only run of
               the same repetition (the first token of each request comes out of prefill).
Tokens/s are medians over the runs and speed-ups are ratios of the medians. The decode-only
split is also computed with the process's user+sys CPU seconds (os.wait4) instead of `seconds`,
as a cross-check (on a contended machine it is no more stable than wall time). Every speculative
run's token ids are compared with the plain run's (greedy: they must be identical). The load
average (1 min) is read before and after each cell. Not a test: prints a Markdown table
(and --json) to paste into bench/RESULTS.md.

usage: bench/spec.py [--pagoda build/pagoda] [--model M] [--runs 3] [--max-tokens 256]
                     [--batches 1,16] [--requests N] [--workloads repetitive,free-form]
                     [--threads 2] [--k 5]
                     [--proposer ngram|draft] [--draft-model PATH]
                     [--spec-args "--speculative-disable-by-batch-size 16" ...] [--json F]
"""
import argparse
import json
import os
import shlex
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


def run(args, reqs, bs, extra, tmp):
    """One `pagoda batch` run; extra: engine flags (None = plain). Returns (stats + cpu_s, token ids)."""
    inp, outp, stats = (Path(tmp) / f for f in ("in.jsonl", "out.jsonl", "stats.json"))
    inp.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    cmd = [args.pagoda, "batch", "-m", args.model, "--input", str(inp), "--output", str(outp),
           "--stats", str(stats), "--no-progress", "-t", str(args.threads),
           "--max-num-seqs", str(bs)] + (extra or [])
    with tempfile.TemporaryFile() as errf:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode:
            errf.seek(0)
            sys.exit(f"failed ({p.returncode}): {shlex.join(cmd)}\n{errf.read().decode()}")
    st = json.loads(stats.read_text())
    st["cpu_s"] = ru.ru_utime + ru.ru_stime  # whole process, model load included
    res = [json.loads(l) for l in outp.read_text().splitlines()]
    bad = [r for r in res if "error" in r]
    if bad:
        sys.exit(f"request error in {shlex.join(cmd)}: {bad[0]}")
    return st, [r["token_ids"] for r in res]


def load1():
    return os.getloadavg()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagoda", default=str(ROOT / "build" / "pagoda"))
    ap.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--workloads", default="repetitive,free-form")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--requests", type=int,
                    help="requests per cell (default: the batch size); with more requests than the "
                         "batch they go through --max-num-seqs = batch, e.g. --batches 1 "
                         "--requests 8 runs all 8 free-form prompts one at a time")
    ap.add_argument("--k", type=int, default=5, help="--num-speculative-tokens (adaptive upper bound)")
    ap.add_argument("--proposer", choices=["ngram", "draft"], default="ngram")
    ap.add_argument("--draft-model", help="the draft model for --proposer draft")
    ap.add_argument("--spec-args", action="append",
                    help="extra engine flags for the speculative runs, e.g. "
                         "\"--speculative-disable-by-batch-size 16\" (a lone flag without a space: "
                         "--spec-args=--flag); repeat for several variants (\"\" = none); "
                         "default: one variant without extra flags")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.proposer == "draft" and not args.draft_model:
        ap.error("--proposer draft needs --draft-model")
    base_spec = ["--speculative", args.proposer, "--num-speculative-tokens", str(args.k)]
    if args.proposer == "draft":
        base_spec += ["--draft-model", args.draft_model]
    variants = [(s, base_spec + shlex.split(s)) for s in (args.spec_args or [""])]
    print(f"plain:       {args.pagoda} batch -m {args.model} -t {args.threads} --max-num-seqs B",
          file=sys.stderr)
    for s, flags in variants:
        print(f"speculative: ... {shlex.join(flags)}", file=sys.stderr)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.workloads.split(","):
            for bs in [int(b) for b in args.batches.split(",")]:
                n_req = max(bs, args.requests or bs)
                reqs = requests(kind, n_req, args.max_tokens)
                pre_reqs = [dict(r, max_tokens=1) for r in reqs]
                # modes: "pre", "plain", then variant indices; the order rotates per run
                modes = ["pre", "plain"] + list(range(len(variants)))
                e2e = {m: [] for m in modes[1:]}
                dec = {m: [] for m in modes[1:]}
                cpu = {m: [] for m in modes[1:]}  # decode tokens per CPU-second (cross-check)
                sums = {i: dict(drafts=0, draft_tokens=0, accepted=0) for i in range(len(variants))}
                same = {i: [] for i in range(len(variants))}
                pre_t = []
                load0 = load1()
                for r in range(args.runs):
                    order = modes[r % len(modes):] + modes[:r % len(modes)]
                    res = {}
                    for m in order:
                        if m == "pre":
                            res[m] = run(args, pre_reqs, bs, None, tmp)
                        else:
                            res[m] = run(args, reqs, bs, None if m == "plain" else variants[m][1], tmp)
                    tp, cp = res["pre"][0]["seconds"], res["pre"][0]["cpu_s"]
                    pre_t.append(tp)
                    line = [f"{kind} batch {bs} ({n_req} requests) run {r + 1} "
                            f"(load {load1():.2f}): prefill-only {tp:.2f} s"]
                    for m in modes[1:]:
                        st, ids = res[m]
                        e2e[m].append(st["generation_tokens"] / st["seconds"])
                        dec[m].append((st["generation_tokens"] - st["requests"]) /
                                      max(1e-9, st["seconds"] - tp))
                        cpu[m].append((st["generation_tokens"] - st["requests"]) /
                                      max(1e-9, st["cpu_s"] - cp))
                        name = "plain" if m == "plain" else f"spec[{m}]"
                        line.append(f"{name} {st['seconds']:.2f} s, {st['generation_tokens']} tok "
                                    f"(e2e {e2e[m][-1]:.1f}, decode {dec[m][-1]:.1f} tok/s; "
                                    f"{st['cpu_s']:.2f} CPU-s, decode {cpu[m][-1]:.1f} tok/CPU-s)")
                        if m != "plain":
                            sums[m]["drafts"] += st["spec_drafts"]
                            sums[m]["draft_tokens"] += st["spec_draft_tokens"]
                            sums[m]["accepted"] += st["spec_accepted_tokens"]
                            same[m].append(ids == res["plain"][1])
                            line[-1] += f", identical to plain: {same[m][-1]}"
                    print("; ".join(line), file=sys.stderr, flush=True)
                load_end = load1()
                b_e2e, b_dec = statistics.median(e2e["plain"]), statistics.median(dec["plain"])
                for i, (s, _) in enumerate(variants):
                    su = sums[i]
                    s_e2e, s_dec = statistics.median(e2e[i]), statistics.median(dec[i])
                    b_cpu, s_cpu = statistics.median(cpu["plain"]), statistics.median(cpu[i])
                    rows.append(dict(
                        workload=kind, batch=bs, requests=n_req, proposer=args.proposer, spec_args=s,
                        runs=args.runs, load_start=load0, load_end=load_end,
                        prefill_only_s=statistics.median(pre_t),
                        plain_e2e_tps=b_e2e, spec_e2e_tps=s_e2e, e2e_speedup=s_e2e / b_e2e,
                        plain_decode_tps=b_dec, spec_decode_tps=s_dec, decode_speedup=s_dec / b_dec,
                        plain_decode_tok_per_cpu_s=b_cpu, spec_decode_tok_per_cpu_s=s_cpu,
                        decode_cpu_speedup=s_cpu / b_cpu,
                        acceptance=su["accepted"] / max(1, su["draft_tokens"]),
                        accepted_per_verify=su["accepted"] / max(1, su["drafts"]),
                        drafts=su["drafts"], draft_tokens=su["draft_tokens"], accepted=su["accepted"],
                        identical=f"{sum(same[i])}/{len(same[i])}",
                        per_run=dict(prefill_only_s=pre_t, plain_e2e=e2e["plain"], spec_e2e=e2e[i],
                                     plain_decode=dec["plain"], spec_decode=dec[i],
                                     plain_decode_cpu=cpu["plain"], spec_decode_cpu=cpu[i])))

    print(f"Medians of {args.runs} runs. End-to-end = generated / T_run (prefill included); "
          f"decode-only = (generated - requests) / (T_run - T_prefill-only). "
          f"Acceptance and accepted / verification summed over the runs. Decode-only by CPU time: "
          f"the same split with the process's user+sys CPU seconds instead of `seconds` "
          f"(a cross-check, less sensitive to other load on the machine).\n", flush=True)
    print("| workload | batch (requests) | proposer, extra flags | load (1 min) "
          "| end-to-end tok/s plain -> spec "
          "| end-to-end speed-up | decode-only tok/s plain -> spec | decode-only speed-up "
          "| acceptance | accepted / verification | outputs identical | decode-only speed-up by CPU time |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        flags = r["proposer"] + (f", `{r['spec_args']}`" if r["spec_args"] else "")
        print(f"| {r['workload']} | {r['batch']} ({r['requests']}) | {flags} "
              f"| {r['load_start']:.1f}-{r['load_end']:.1f} "
              f"| {r['plain_e2e_tps']:.1f} -> {r['spec_e2e_tps']:.1f} | {r['e2e_speedup']:.2f}x "
              f"| {r['plain_decode_tps']:.1f} -> {r['spec_decode_tps']:.1f} | {r['decode_speedup']:.2f}x "
              f"| {100 * r['acceptance']:.0f}% | {r['accepted_per_verify']:.2f} | {r['identical']} "
              f"| {r['decode_cpu_speedup']:.2f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    differ = [r for r in rows if r["identical"].split("/")[0] != r["identical"].split("/")[1]]
    for r in differ:
        print(f"OUTPUTS DIFFER: {r['workload']} batch {r['batch']} {r['proposer']} "
              f"{r['spec_args']!r}: identical in {r['identical']} runs", file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
