"""PEFT LoRA adapters for the LoRA tests, and their references (peft on transformers, float32).

An adapter is made the way a user makes one: `get_peft_model` on the tiny HF model with a
`LoraConfig`, then `save_pretrained`, which writes adapter_config.json and
adapter_model.safetensors (tensors named base_model.model.model.layers.<i>.<self_attn|mlp>.
<module>.lora_<A|B>.weight: A is (r, in), B is (out, r)). peft initializes B to zeros (an adapter
that changes nothing), so every lora_A and lora_B is overwritten with seeded random values large
enough to move the logits by far more than the comparison bounds. The reference reloads the
saved directory with `PeftModel.from_pretrained` on a fresh base model, so it computes exactly
what the files say (scale lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora)."""
import torch

# The projections Pagoda applies adapters to.
ALL7 = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_adapter(model_dir, out_dir, seed, a_std=0.1, b_std=0.05, dtype=None, **config):
    """Saves a PEFT LoRA adapter of the HF model in model_dir to out_dir (LoraConfig(**config),
    lora_dropout 0, every lora_A/lora_B N(0, a_std^2)/N(0, b_std^2) from a generator seeded
    with seed), its tensors stored as dtype (torch.float16 / bfloat16; None: float32, as PEFT
    saves them). PEFT reads a half-precision adapter back into float32 modules, so the reference
    computes with exactly the stored values. Returns out_dir."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(lora_dropout=0.0, task_type="CAUSAL_LM", **config))
    gen = torch.Generator().manual_seed(seed)
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_A." in name or ".lora_B." in name:
                std = a_std if ".lora_A." in name else b_std
                p.copy_(std * torch.randn(p.shape, generator=gen))
                n += 1
    assert n, "peft made no LoRA weights"
    model.save_pretrained(str(out_dir))
    if dtype is not None:
        from safetensors.torch import load_file, save_file
        f = str(out_dir / "adapter_model.safetensors")
        save_file({k: v.to(dtype) for k, v in load_file(f).items()}, f,
                  metadata={"format": "pt"})
    return out_dir


class Ref:
    """transformers (optionally with a PEFT adapter loaded from its directory), float32, eval."""

    def __init__(self, model_dir, adapter_dir=None):
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model.generation_config.eos_token_id = None  # like --ignore-eos: eos is just a token
        if adapter_dir is not None:
            from peft import PeftModel
            model = PeftModel.from_pretrained(model, str(adapter_dir))
        self.model = model.eval()

    @torch.no_grad()
    def logits(self, ids):
        return self.model(input_ids=torch.tensor([ids])).logits[0].numpy()

    @torch.no_grad()
    def greedy(self, ids, n):
        """generate(do_sample=False), n tokens, end-of-sequence just a token (--ignore-eos)."""
        out = self.model.generate(input_ids=torch.tensor([ids]),
                                  attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                  do_sample=False, max_new_tokens=n, pad_token_id=0)
        return out[0, len(ids):].tolist()
