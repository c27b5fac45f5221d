"""Random-weight presets carry the published models' shapes: parameter counts and vocabulary sizes."""

import pytest
import torch

from nanorllm.policy.presets import PRESETS, preset_model_and_tokenizer, preset_tokenizer

PUBLISHED_PARAMS = {"smollm2-135m": 134.5e6, "qwen2.5-0.5b": 494.0e6, "qwen2.5-1.5b": 1543.7e6}  # model cards


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_preset_has_the_published_parameter_count(name):
    cls, config_cls, shape = PRESETS[name]
    with torch.device("meta"):  # shapes only, no memory
        model = cls(config_cls(**shape))
    n = sum(p.numel() for p in model.parameters())
    assert abs(n - PUBLISHED_PARAMS[name]) / PUBLISHED_PARAMS[name] < 0.01, n


def test_a_preset_tokenizer_fills_the_vocabulary_and_still_round_trips_text():
    tok = preset_tokenizer(49152)
    assert len(tok) == 49152 and tok.eos_token_id < 49152
    ids = tok("What is 2 + 3?", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == "What is 2 + 3?" and max(ids) < 256  # text is bytes; fillers are never encoded


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(ValueError, match="preset:qwen2.5-0.5b"):
        preset_model_and_tokenizer("preset:gpt-5")
