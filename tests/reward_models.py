"""A tiny random sequence classifier saved as a reward-model folder, with the tiny-random preset's tokenizer:
no hub, a second to build."""

import json
from pathlib import Path

import torch


def tiny_reward_model(folder: Path, *, num_labels: int = 1, architecture: str = "LlamaForSequenceClassification",
                      seed: int = 0, extra_tokens: int = 0) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    from nanorllm.policy.byte_tokenizer import tiny_tokenizer

    tok = tiny_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, num_labels=num_labels,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    cls = LlamaForCausalLM if architecture == "LlamaForCausalLM" else LlamaForSequenceClassification
    torch.manual_seed(seed)
    cls(config).save_pretrained(folder)
    tok.add_tokens([f"<extra_{i}>" for i in range(extra_tokens)])  # a tokenizer larger than the model
    tok.save_pretrained(folder)
    return str(folder)


def relabelled(folder: str, **fields) -> str:
    """The folder with `fields` set in its config.json (a config that no longer fits its weights)."""
    path = Path(folder) / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | fields))
    return folder
