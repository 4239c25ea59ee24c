"""Speculative decoding is exact (issue 6, proofs 1 and 2).

1. Greedy: for 64 mixed requests under continuous batching (chunked prefill, prefix caching,
   staggered arrivals, a KV pool small enough to preempt), outputs with n-gram speculation and
   with a draft model are identical, token for token, to the engine without speculation.
2. Sampling: with temperature 1 (and with top-p 0.9) the distribution of the first three
   generated tokens over many seeded trials is the same with speculation as without (a
   two-sample chi-square test of homogeneity at significance 0.001), and the same test FAILS
   when the verifier is deliberately broken to accept every proposal
   (PAGODA_TEST_SPEC_ALWAYS_ACCEPT=1): the trial count has the power to see a wrong verifier.

Models: stories260K (context raised to 4096, see test_engine.py); as draft, itself (greedy
drafts always match) and a perturbed copy whose FFN weights carry multiplicative noise (same
vocabulary, different distribution: proposals are often rejected)."""
import json
import math
from collections import Counter

import numpy as np
import pytest

from test_engine import assert_same, long_model, make_requests, run_batch  # noqa: F401
from util import DATA

ALPHA = 0.001


@pytest.fixture(scope="module")
def perturbed_draft(long_model, tmp_path_factory):  # noqa: F811
    import gguf

    buf = bytearray(long_model.read_bytes())
    r = gguf.GGUFReader(long_model)
    rng = np.random.default_rng(7)
    for t in r.tensors:
        if t.name.endswith("ffn_down.weight"):
            assert t.tensor_type == gguf.GGMLQuantizationType.F32
            n = int(np.prod(t.shape))
            w = np.frombuffer(buf, dtype=np.float32, count=n, offset=t.data_offset).copy()
            w *= 1 + 0.5 * rng.standard_normal(n).astype(np.float32)
            buf[t.data_offset:t.data_offset + 4 * n] = w.tobytes()
    p = tmp_path_factory.mktemp("draft") / "stories260K-perturbed.gguf"
    p.write_bytes(bytes(buf))
    return p


STORIES_PROMPTS = ["Once upon a time, there was a little girl named Lily.",
                   "Tom and his mom went to the store. Tom wanted a toy.",
                   "The sun was hot. The dog was sad. The dog wanted to play in the water.",
                   "One day, a bird"]


@pytest.fixture(scope="module")
def greedy_reference(long_model, tmp_path_factory):  # noqa: F811
    reqs = make_requests()
    for i, r in enumerate(reqs):  # all greedy; some repeat their prompt so n-grams match
        r["temperature"] = 0
        if i % 3 == 0:
            r["prompt"] = (r["prompt"] + r["prompt"][1:])[:1500]
        if i % 4 == 1:  # stories: greedy tiny-model text loops, which n-gram lookup exploits
            r["prompt"] = STORIES_PROMPTS[i % len(STORIES_PROMPTS)]
            r["max_tokens"] = 100 + i
        if i % 7 == 1:
            r["repetition_penalty"] = 1.2
            r["presence_penalty"] = 0.3
    res, _ = run_batch(long_model, tmp_path_factory.mktemp("ref"), "plain", reqs,
                       "--max-num-batched-tokens", "64")
    return reqs, res


SPEC_CONFIGS = {
    "ngram-chunk64": ["--speculative", "ngram", "--max-num-batched-tokens", "64"],
    "ngram-k3-staggered": ["--speculative", "ngram", "--num-speculative-tokens", "3",
                           "--max-num-batched-tokens", "512", "--stagger", "3"],
    "ngram-preempt": ["--speculative", "ngram", "--kv-cache-memory", "1.25MiB",
                      "--max-num-batched-tokens", "128", "--block-size", "8"],
    "draft-self": ["--speculative", "draft", "--max-num-batched-tokens", "64"],
    "draft-perturbed": ["--speculative", "draft", "--num-speculative-tokens", "4",
                        "--max-num-batched-tokens", "64", "--no-prefix-caching"],
}


@pytest.mark.parametrize("name", list(SPEC_CONFIGS))
def test_greedy_speculation_is_exact(long_model, perturbed_draft, tmp_path, greedy_reference,  # noqa: F811
                                     name):
    reqs, ref = greedy_reference
    opts = list(SPEC_CONFIGS[name])
    if name.startswith("draft"):
        opts += ["--draft-model", perturbed_draft if "perturbed" in name else long_model]
    res, stats = run_batch(long_model, tmp_path, name, reqs, *opts)
    assert_same(res, ref)
    assert stats["spec_drafts"] > 0 and stats["spec_accepted_tokens"] > 0
    assert stats["spec_accepted_tokens"] < stats["spec_draft_tokens"] or name == "draft-self"
    assert sum(stats["spec_accepted_per_pos"]) == stats["spec_accepted_tokens"]
    assert stats["kv_blocks_used"] == 0
    if name == "ngram-preempt":
        assert stats["preemptions"] > 0


# ---- the statistical test ----

def chi2_sf(x, df):
    """P(X > x) for X ~ chi-square(df): the regularized upper incomplete gamma Q(df/2, x/2)."""
    a, x = df / 2.0, x / 2.0
    if x <= 0:
        return 1.0
    lg = math.lgamma(a)
    if x < a + 1:  # series for P
        s = term = 1.0 / a
        n = a
        for _ in range(10000):
            n += 1
            term *= x / n
            s += term
            if term < s * 1e-15:
                break
        return max(0.0, 1.0 - s * math.exp(-x + a * math.log(x) - lg))
    b, c, d = x + 1 - a, 1e300, 1.0 / (x + 1 - a)  # continued fraction for Q (Lentz)
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1.0 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - lg) * h


def test_chi2_sf_known_values():
    # tabulated critical values, and the closed form for even df: e^-y sum_{i<df/2} y^i / i!
    assert abs(chi2_sf(3.841458820694124, 1) - 0.05) < 1e-9
    assert abs(chi2_sf(23.209251158954356, 10) - 0.01) < 1e-9
    for x, df in [(5.0, 20), (40.0, 30), (100.0, 60), (0.5, 2)]:
        y = x / 2
        want = math.exp(-y) * sum(y ** i / math.factorial(i) for i in range(df // 2))
        assert abs(chi2_sf(x, df) - want) < 1e-10


def homogeneity_p(a, b):
    """Two-sample chi-square test of homogeneity on two Counters of equal totals; categories
    with fewer than 10 pooled observations are merged into one."""
    pooled = a + b
    cats = [k for k, v in pooled.items() if v >= 10]
    rest = [k for k in pooled if k not in set(cats)]
    rows = [(a[k], b[k]) for k in cats]
    if rest:
        rows.append((sum(a[k] for k in rest), sum(b[k] for k in rest)))
    na, nb = sum(a.values()), sum(b.values())
    stat = 0.0
    for x, y in rows:
        tot = x + y
        ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
        stat += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
    return chi2_sf(stat, max(1, len(rows) - 1)), len(rows)


# A repetitive story: when the first sampled token continues the repetition (" went"), the
# n-gram proposer offers the rest (" to the park"), and the model is far from certain about it
# at temperature 1 (about a fifth of the proposals are accepted). A prompt whose continuation
# the model is sure of would give the broken verifier nothing to get wrong.
PROMPT = "Lily and Ben went to the park. They saw a big dog. Lily and Ben"
N_TRIALS = 3000


def sample_runs(model, tmp_path, name, sampling, *opts, seed0=0):
    """N_TRIALS requests; seeds from seed0. Runs compared with each other use disjoint seeds:
    with the same seed, a request that never speculates draws the very same tokens, which
    would make the two samples dependent and the test blind."""
    reqs = [dict(id=i, prompt=PROMPT, max_tokens=3, seed=seed0 + i, ignore_eos=True,
                 **sampling) for i in range(N_TRIALS)]
    res, stats = run_batch(model, tmp_path, name, reqs, "--max-num-batched-tokens", "512", *opts)
    toks = [tuple(r["token_ids"]) for r in res]
    assert all(len(t) == 3 for t in toks)
    return toks, stats


def distributions(toks):
    return [Counter(t[:3] for t in toks), Counter(t[1] for t in toks), Counter(t[2] for t in toks)]


SAMPLING = {"t1": {"temperature": 1.0}, "t1-top-p0.9": {"temperature": 1.0, "top_p": 0.9}}


@pytest.mark.parametrize("sampling", list(SAMPLING))
def test_sampled_distribution_unchanged(long_model, perturbed_draft, tmp_path, monkeypatch,  # noqa: F811
                                        sampling):
    sp = SAMPLING[sampling]
    base, _ = sample_runs(long_model, tmp_path, "plain", sp)
    ref = distributions(base)
    runs = {
        "ngram": ["--speculative", "ngram", "--num-speculative-tokens", "3"],
        "draft": ["--speculative", "draft", "--draft-model", perturbed_draft,
                  "--num-speculative-tokens", "3"],
    }
    for i, (name, opts) in enumerate(runs.items()):
        toks, stats = sample_runs(long_model, tmp_path, name, sp, *opts, seed0=(i + 1) * 10**6)
        # speculation really happened, with both outcomes
        assert stats["spec_draft_tokens"] > N_TRIALS / 10, name
        acc = stats["spec_accepted_tokens"] / stats["spec_draft_tokens"]
        assert 0.05 < acc < 0.95, (name, acc)
        for what, a, b in zip(["joint", "token 2", "token 3"], ref, distributions(toks)):
            p, k = homogeneity_p(a, b)
            assert p > ALPHA, f"{name}: {what} differs (p = {p:.2e}, {k} categories)"
    # The same test must reject a broken verifier that accepts every proposal.
    monkeypatch.setenv("PAGODA_TEST_SPEC_ALWAYS_ACCEPT", "1")
    toks, _ = sample_runs(long_model, tmp_path, "broken", sp, *runs["ngram"], seed0=9 * 10**6)
    p = min(homogeneity_p(a, b)[0] for a, b in zip(ref, distributions(toks)))
    assert p < ALPHA, f"a verifier that always accepts went unnoticed (p = {p:.3g})"


def test_logprobs_and_sampler_fields(long_model, tmp_path):  # noqa: F811
    """logprobs come from the raw distribution: identical with and without speculation and
    whatever the sampling knobs; logit_bias and min_tokens act as specified."""
    base = {"id": 0, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 3,
            "ignore_eos": True}
    reqs = [dict(base), dict(base, id=1, repetition_penalty=1.5, min_p=0.1),
            dict(base, id=2, logit_bias={"13": 100}), dict(base, id=3, logprobs=None)]
    a, _ = run_batch(long_model, tmp_path, "lp", reqs)
    b, _ = run_batch(long_model, tmp_path, "lp-spec", reqs, "--speculative", "ngram")
    assert a == b
    lp = a[0]["logprobs"]
    assert len(lp) == 8 and [x["token"] for x in lp] == a[0]["token_ids"]
    for x in lp:
        tops = x["top_logprobs"]
        assert len(tops) == 3 and tops[0]["logprob"] >= tops[1]["logprob"] >= tops[2]["logprob"]
        assert x["token"] == tops[0]["token"]  # greedy: the raw arg-max
        assert abs(x["logprob"] - tops[0]["logprob"]) < 1e-6 and x["logprob"] <= 0
    assert a[2]["token_ids"] == [13] * 8
    assert "logprobs" not in a[3]
    # logprobs of the same context do not depend on the sampler: request 1's first token
    # logprob is request 0's
    assert abs(a[1]["logprobs"][0]["top_logprobs"][0]["logprob"] - lp[0]["top_logprobs"][0]["logprob"]) < 1e-6
