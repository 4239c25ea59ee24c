"""bench/serve.py against a real `pagoda serve` on stories260K: the results file has vLLM's
metrics, token counts are exact, the metric definitions hold on the per-request records, and the
agent loop sees the prefix cache. bench/serve.py runs in the bench virtualenv
(scripts/setup-venv.sh bench/requirements.txt), as a subprocess."""
import json
import subprocess
import sys

import pytest

import util
from server_util import STORIES, Server

SERVE_PY = util.ROOT / "bench" / "serve.py"


@pytest.fixture(scope="module")
def bench_python():
    p = subprocess.run(["bash", str(util.ROOT / "scripts" / "setup-venv.sh"),
                        str(util.ROOT / "bench" / "requirements.txt")],
                       capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        pytest.skip(f"bench virtualenv unavailable: {p.stderr[-500:]}")
    return p.stdout.strip().splitlines()[-1] + "/bin/python"


def run_bench(bench_python, url, out_dir, *args):
    cmd = [bench_python, str(SERVE_PY), "--base-url", url, "--result-dir", str(out_dir),
           "--no-plots", "--seed", "1"] + [str(a) for a in args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=util.ROOT)
    assert p.returncode == 0, f"{cmd} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout


def test_random_workload_exact_and_metrics(bench_python, tmp_path):
    with Server(STORIES) as srv:
        out = run_bench(bench_python, srv.url(), tmp_path, "--workload", "random",
                        "--num-prompts", 6, "--input-len", 12, "--output-len", 8,
                        "--max-concurrency", "1,3", "--goodput", "ttft:60000", "tpot:60000",
                        "--name", "t")
    assert "Time to First Token" in out and "Output token throughput" in out
    res = json.loads((tmp_path / "t.json").read_text())
    assert [r["max_concurrency"] for r in res["runs"]] == [1, 3]
    for run in res["runs"]:
        assert run["completed"] == 6 and run["failed"] == 0
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
            assert set(run[key]) >= {"mean", "median", "p90", "p99"}, key
        for key in ("request_throughput", "output_throughput", "total_token_throughput", "goodput"):
            assert run[key] > 0, key
        # exact token counts: the server's usage agrees with what was asked
        assert run["exact_input_lengths"] and run["exact_output_lengths"]
        for r in run["requests"]:
            assert r["server_prompt_tokens"] == r["prompt_len"] == 12
            assert r["output_len"] == r["expected_output_len"] == 8
        assert run["total_input_tokens"] == 6 * 12 and run["total_output_tokens"] == 6 * 8
        # vLLM's definitions, recomputed from the per-request records
        tpots = sorted((r["latency_s"] - r["ttft_s"]) / (r["output_len"] - 1) for r in run["requests"])
        assert abs(sum(tpots) / 6 * 1000 - run["tpot_ms"]["mean"]) < 1e-6
        assert abs(run["output_throughput"] - 48 / run["duration_s"]) < 1e-6
        assert run["goodput"] == pytest.approx(run["request_throughput"])  # loose SLOs: all good
        assert all(r["ttft_s"] <= r["latency_s"] for r in run["requests"])


def test_agent_loop_uses_prefix_cache(bench_python, tmp_path):
    with Server(STORIES) as srv:
        out = run_bench(bench_python, srv.url(), tmp_path, "--workload", "agent",
                        "--conversations", 2, "--rounds", 3, "--system-len", 40, "--task-len", 8,
                        "--feedback-len", 8, "--reply-len", 6, "--name", "a")
    assert "prefill tokens requested" in out
    run = json.loads((tmp_path / "a.json").read_text())["runs"][0]
    assert run["completed"] == 6 and run["failed"] == 0
    assert len(run["ttft_ms_per_round"]) == 3
    assert all(x["n"] == 2 for x in run["ttft_ms_per_round"])
    assert run["stopped_by"]["rounds"] == 2
    # every round re-sends the conversation: later rounds hit the cached blocks of earlier ones
    assert run["prefix_cache"]["hits"] > 0
    assert run["prefill_tokens_computed"] < run["prefill_tokens_requested"]
    assert run["prefill_tokens_requested"] == run["total_input_tokens"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
