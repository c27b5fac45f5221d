"""Tiny random causal LMs of several families, built locally (no hub), with the byte tokenizer.

Each family has a quirk in how its forward turns hidden states into logits, which a learner that
applies the output embedding itself would miss:
- llama, qwen2: plain head (the baseline);
- gemma2: final-logit soft-capping (tanh(x / cap) * cap), and embeddings scaled by sqrt(hidden);
- granite: logits divided by `logits_scaling`.
"""

import torch
from transformers import (Gemma2Config, Gemma2ForCausalLM, GraniteConfig, GraniteForCausalLM, LlamaConfig,
                          LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM)

from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.policy.byte_tokenizer import tiny_tokenizer

FAMILIES = ("llama", "qwen2", "gemma2", "granite")


def tiny_family_model(family: str, tokenizer, *, seed: int = 0, **overrides) -> torch.nn.Module:
    common = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    if family == "llama":
        cls, config = LlamaForCausalLM, LlamaConfig(**common, **overrides)
    elif family == "qwen2":
        cls, config = Qwen2ForCausalLM, Qwen2Config(**common, **overrides)
    elif family == "gemma2":
        cls, config = Gemma2ForCausalLM, Gemma2Config(**common, head_dim=16, final_logit_softcapping=5.0,
                                                       attn_logit_softcapping=50.0, **overrides)
    elif family == "granite":
        cls, config = GraniteForCausalLM, GraniteConfig(**common, logits_scaling=8.0, **overrides)
    else:
        raise ValueError(family)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = cls(config)
    with torch.no_grad():  # larger weights than the init: logits big enough for the quirks to matter
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(20.0)
    torch.random.set_rng_state(state)
    return model.eval()


def tiny_family_policy(family: str, *, seed: int = 0, **overrides) -> HFCausalPolicy:
    tokenizer = tiny_tokenizer()
    return HFCausalPolicy(tiny_family_model(family, tokenizer, seed=seed, **overrides), tokenizer, seed=seed)
