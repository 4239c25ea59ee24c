#!/usr/bin/env python3
"""GBNF grammar output end to end: what a grammar request costs per generated token on a real
server, beside the other ways to constrain the same answer and beside no constraint.

A `pagoda serve` runs the model (default: the default model). For each mode the same greedy
chat request is sent --concurrency at a time (each its own prompt), --reps rounds; reported is
the milliseconds per generated token of a whole round (wall time / tokens of its requests), the
median over the rounds, and its ratio to the unconstrained mode. Modes:
  free         no constraint (the baseline)
  json_object  response_format json_object: the hand-written JSON machine
  json.gbnf    llama.cpp's grammars/json.gbnf through "grammar"
  list.gbnf    a free-text list grammar (`- item` lines)
  list.regex   the same language through guided_regex (a DFA)
The constrained answers of json_object and json.gbnf are also compared (they should agree).
--task copy asks instead to repeat a JSON document (or a list) given in the prompt, the case
where --speculative ngram (passed to the server) has proposals to verify.

usage: python3 bench/grammar_serve.py [--pagoda build/pagoda] [--model M] [--reps 5]
           [--concurrency 1] [--max-tokens 96] [--task describe|copy] [--speculative ngram]
"""
import argparse
import json
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import serve  # noqa: E402  (Server)

ROOT = Path(__file__).resolve().parent.parent

JSON_GBNF = (ROOT / "tests" / "data" / "grammars" / "json.gbnf").read_text(encoding="utf-8")
LIST_GBNF = 'root ::= item+\nitem ::= "- " [^\\n]+ "\\n"'
LIST_REGEX = "(- [^\\n]+\\n)+"

MODES = {
    "free": {},
    "json_object": {"response_format": {"type": "json_object"}},
    "json.gbnf": {"grammar": JSON_GBNF},
    "list.gbnf": {"guided_grammar": LIST_GBNF},
    "list.regex": {"guided_regex": LIST_REGEX},
}
TOPICS = ["a person", "a city", "a book", "a car", "a planet", "a recipe", "a song", "a dog"]


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


DOC = ('{"name": "Ada Lovelace", "born": 1815, "field": "mathematics", '
       '"known_for": "the first published program", "languages": ["English", "French"]}')
LIST = "- eggs\n- milk and honey\n- two loaves of bread\n- a jar of jam\n"


def one_round(url, mode, n, max_tokens, task):
    out = [None] * n

    def run(i):
        kind = "a JSON object" if "json" in mode else "a list"
        ask = (f"Describe {TOPICS[i % 8]} as {kind} with a long description." if task == "describe"
               else f"Repeat this exactly ({i}): " + (DOC if "json" in mode else LIST))
        body = {"messages": [{"role": "user", "content": ask}],
                "max_tokens": max_tokens, "temperature": 0, **MODES[mode]}
        out[i] = post(url, body)
    t0 = time.perf_counter()
    th = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    dt = time.perf_counter() - t0
    tokens = sum(r["usage"]["completion_tokens"] for r in out)
    return dt * 1000 / tokens, [r["choices"][0]["message"]["content"] for r in out]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", default=str(ROOT / "build" / "pagoda"))
    ap.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--task", choices=["describe", "copy"], default="describe")
    ap.add_argument("--speculative", choices=["ngram"])
    args = ap.parse_args()
    spec = ["--speculative", args.speculative] if args.speculative else []
    srv = serve.Server([args.pagoda, "serve", "-m", args.model, "--port", "0", "-t",
                        str(args.threads), "--no-log-requests", *spec])
    try:
        url = srv.base_url + "/v1/chat/completions"
        for _ in range(600):  # until the model is loaded
            try:
                urllib.request.urlopen(srv.base_url + "/health", timeout=5)
                break
            except OSError:
                time.sleep(0.2)
        post(url, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        ms = {m: [] for m in MODES}
        texts = {}
        for _ in range(args.reps):  # modes interleaved, so drift hits them alike
            for m in MODES:
                t, texts[m] = one_round(url, m, args.concurrency, args.max_tokens, args.task)
                ms[m].append(t)
        base = statistics.median(ms["free"])
        print(f"model {Path(args.model).name}, concurrency {args.concurrency}, "
              f"max_tokens {args.max_tokens}, task {args.task}, speculative "
              f"{args.speculative or 'off'}, {args.reps} rounds (median ms per token)")
        for m in MODES:
            med = statistics.median(ms[m])
            print(f"{m:12s} {med:7.2f} ms/token  {med / base:5.2f}x free  "
                  f"(rounds: {', '.join(f'{x:.2f}' for x in ms[m])})")
        same = sum(a == b for a, b in zip(texts["json_object"], texts["json.gbnf"]))
        print(f"json_object and json.gbnf answers equal: {same} of {args.concurrency}")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
