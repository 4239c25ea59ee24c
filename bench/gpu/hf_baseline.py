"""transformers generate on a Llama-3-8B-shaped model with random BF16 weights (the same shapes
as pagoda's --load-format dummy): decode tok/s at batch 1/8/64/256 after 512-token prompts and
prefill tok/s at 2,048 tokens. One JSON object per line."""
import json, sys, time
import torch
from transformers import AutoConfig, AutoModelForCausalLM

cfg = AutoConfig.for_model(**{k: v for k, v in json.load(open(sys.argv[1])).items() if k != "architectures"})
torch.manual_seed(0)
with torch.device("cuda"):
    try:  # transformers >= 4.56 names it dtype; older ones torch_dtype
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    except TypeError:
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16).eval()
attn = getattr(model.config, "_attn_implementation", None)
print(json.dumps({"bench": "hf_env", "torch": torch.__version__,
                  "gpu": torch.cuda.get_device_name(0), "attn": attn}), flush=True)
V = cfg.vocab_size
for bs in (1, 8, 64, 256):
    ids = torch.randint(3, V, (bs, 512), device="cuda")
    model.generate(ids, max_new_tokens=2, min_new_tokens=2, do_sample=False)
    torch.cuda.synchronize()
    t0 = time.time()
    model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False)
    torch.cuda.synchronize()
    t_pre = time.time() - t0
    n = 32
    t0 = time.time()
    model.generate(ids, max_new_tokens=n + 1, min_new_tokens=n + 1, do_sample=False)
    torch.cuda.synchronize()
    dt = time.time() - t0 - t_pre
    print(json.dumps({"bench": "hf_decode", "batch": bs, "ctx": 512, "tok_s": bs * n / dt}), flush=True)
ids = torch.randint(3, V, (1, 2048), device="cuda")
with torch.no_grad():
    model(ids)
    torch.cuda.synchronize()
    t0 = time.time()
    model(ids)
    torch.cuda.synchronize()
print(json.dumps({"bench": "hf_prefill", "tokens": 2048, "tok_s": 2048 / (time.time() - t0)}))
