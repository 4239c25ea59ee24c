"""stories260K (Karpathy's tinyllamas, GGUF F32): greedy text from BOS matches llama2.c / llama.cpp."""
import util


def test_stories260k_greedy_from_bos(pagoda_bin):
    model = util.DATA / "models" / "stories260K.gguf"
    expected = (util.DATA / "models" / "stories260K.expected.txt").read_text(encoding="utf-8")
    # The expected text is 131 tokens of this model's 512-token vocabulary (132 with BOS);
    # 200 cover it with room and stay well inside the 512-token context.
    p = util.run_pagoda("generate", "-m", model, "-p", "", "-n", 200, "--temperature", "0")
    text = p.stdout.decode("utf-8")
    n_same = next((i for i, (a, b) in enumerate(zip(text, expected)) if a != b), min(len(text), len(expected)))
    assert text.startswith(expected), (
        f"differs at char {n_same}: expected {expected[n_same:n_same + 40]!r}, "
        f"got {text[n_same:n_same + 40]!r}")


def test_profile_counts_every_op(pagoda_bin, monkeypatch):
    """PAGODA_PROFILE=1 times each op of the layer program: one q/k/v/o/gate/up/down matmul per
    layer per step, two RMSNorms per layer, one LM head per step; the output is unchanged."""
    model = util.DATA / "models" / "stories260K.gguf"
    args = ("generate", "-m", model, "-p", "Once upon", "-n", 20, "--temperature", "0")
    plain = util.run_pagoda(*args)
    assert b"pagoda profile" not in plain.stderr
    monkeypatch.setenv("PAGODA_PROFILE", "1")
    prof = util.run_pagoda(*args)
    assert prof.stdout == plain.stdout
    lines = prof.stderr.decode().splitlines()
    head = next(i for i, l in enumerate(lines) if l.startswith("pagoda profile (rank 0): "))
    steps = int(lines[head].split(": ")[1].split()[0])
    rows = {}
    for l in lines[head + 2:]:
        if not l.startswith("  "):
            break
        name, rest = l[2:16].strip(), l[16:].split()
        rows[name] = rest
    calls = {k: int(v[0]) for k, v in rows.items() if k != "the rest"}
    assert calls["lm head"] == steps > 1
    n_layer = calls["matmul q"] // steps
    assert n_layer >= 1 and calls["matmul q"] == n_layer * steps
    for op in ("matmul k", "matmul v", "matmul o", "matmul gate", "matmul up", "matmul down",
               "attention", "rope+kv store", "silu*up"):
        assert calls[op] == n_layer * steps, op
    assert calls["rms_norm"] == 2 * n_layer * steps
    shares = [float(v[-1].rstrip("%")) for v in rows.values()]
    assert abs(sum(shares) - 100.0) < 1.0
