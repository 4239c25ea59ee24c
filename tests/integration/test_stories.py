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
