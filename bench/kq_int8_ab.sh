#!/bin/sh
# F32 against 8-bit activations on K-quant weights (issue 37): `pagoda bench` on a dummy model of
# a config.json's shapes, PAGODA_INT8_ACT=0 and =1 alternated for R rounds per weight type, one
# JSON line per run; prints the median of each figure over the rounds and the int8/F32 ratio.
#   bench/kq_int8_ab.sh PAGODA_BIN CONFIG.json [ROUNDS=3] [THREADS=2] [TYPES="q4_k q4_k_m"]
# CONFIG "tinyllama" writes TinyLlama-1.1B's shapes to a temporary config.json.
# e.g. bench/kq_int8_ab.sh build/pagoda tinyllama 3 2 "q4_k q4_k_m q5_k q6_k"
set -eu
BIN=$1
CFG=$2
if [ "$CFG" = tinyllama ]; then
    CFG=$(mktemp --suffix=.json)
    trap 'rm -f "$CFG"' EXIT
    cat >"$CFG" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
 "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": false,
 "torch_dtype": "bfloat16", "vocab_size": 32000, "bos_token_id": 1, "eos_token_id": 2,
 "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
 "num_attention_heads": 32, "num_key_value_heads": 4, "max_position_embeddings": 2048}
JSON
fi
R=${3:-3}
T=${4:-2}
TYPES=${5:-"q4_k q4_k_m"}
OUT=$(mktemp)
for ty in $TYPES; do
    i=0
    while [ "$i" -lt "$R" ]; do
        for a in 0 1; do
            printf '{"type":"%s","int8":%s,"run":' "$ty" "$a" >>"$OUT"
            PAGODA_DUMMY_TYPE=$ty PAGODA_INT8_ACT=$a "$BIN" bench -m "$CFG" --load-format dummy \
                -p 512 -n 128 -t "$T" -r 1 --batch 16,64 --json 2>/dev/null | tr -d '\n' >>"$OUT"
            echo '}' >>"$OUT"
        done
        i=$((i + 1))
    done
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
fig = {}
for r in runs:
    for x in r["run"]["results"]:
        fig.setdefault((r["type"], x["test"], r["int8"]), []).append(x["tokens_per_s"])
print("| type | test | F32 act t/s | int8 act t/s | int8 / F32 | rounds |")
print("| --- | --- | --- | --- | --- | --- |")
for (ty, test, a), v in fig.items():
    if a: continue
    w = fig[(ty, test, 1)]
    f, i = statistics.median(v), statistics.median(w)
    print(f"| {ty} | {test} | {f:.2f} | {i:.2f} | {i / f:.2f}x | {len(v)} |")
PY
echo "raw runs: $OUT"
