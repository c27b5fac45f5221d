"""LoRA adapters on a policy's model (through peft): which parameters train, what a worker needs, what is saved.

Why: a full fine-tune holds ~16 bytes a parameter (fp32 weight, gradient, two AdamW moments), so a
1.5B model needs ~24 GB before one activation. With `--lora-rank R` the base is loaded once in the
run's dtype and frozen; only peft's low-rank adapters (fp32, a few MB) take gradients, reach AdamW,
cross the shared weight store and go into checkpoints.

Layout: peft injects its layers into the HF model *in place* (`get_peft_model`), so the policy keeps
the HF model itself as `policy.model` (its forward, head hook, prefix sharing, slot KV cache and the
startup parity check are unchanged) and holds the `PeftModel` wrapper apart (`policy.peft`) for what
only peft does: disabling the adapters (the KL reference), saving in peft's own format, merging.

`trainable_parameters` is the one answer to "which parameters train": the optimizer, the weight
store, the finite-weights check and a memory plan all ask it. It is `requires_grad`, which peft
sets on the adapters alone; a full fine-tune trains (and publishes) every parameter.

Workers sample with adapters unmerged (peft's forward: base output + scale x B(A(x))), loaded in place
each publish: their base is never touched, so nothing drifts however many publishes a run makes,
and the parameters keep their addresses (what replayed CUDA graphs need). docs/lora.md has the measurement
behind unmerged vs merged-from-pristine-base.
"""

import contextlib
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

DEFAULT_TARGETS = "attn-mlp"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


class LoraError(ValueError):
    """LoRA cannot be applied as asked (targets that match nothing, a model peft cannot wrap): bad input."""


@dataclass(frozen=True)
class LoraSpec:
    rank: int  # of each adapter: A is (rank, in), B is (out, rank)
    alpha: float  # the adapter's output is scaled by alpha / rank
    dropout: float = 0.0  # on the adapter's input, in train mode only
    targets: str = DEFAULT_TARGETS  # "attn-mlp", "all-linear" or a comma list of module names (target_names)


def effective_alpha(rank: int, alpha: float | None) -> float:
    """--lora-alpha, or 2 x rank when unset (a scale alpha / rank of 2)."""
    return float(2 * rank if alpha is None else alpha)


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """Qualified names of the model's nn.Linear layers, its output head left out (never adapted)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head]


def target_names(model: torch.nn.Module, targets: str) -> list[str]:
    """The leaf module names peft is to wrap (peft matches a name to every module ending in it).

    "attn-mlp": every linear layer inside a repeated block (a decoder layer's attention and MLP
    projections); "all-linear": every linear layer but the head; else a comma list of leaf names,
    each of which must name a linear layer."""
    linear = linear_module_names(model)
    in_blocks = [n for n in linear if any(part.isdigit() for part in n.split("."))]
    if targets == DEFAULT_TARGETS:
        chosen = in_blocks
    elif targets == "all-linear":
        chosen = linear
    else:
        wanted = [t.strip() for t in targets.split(",") if t.strip()]
        leaves = {n.rsplit(".", 1)[-1] for n in linear}
        missing = [t for t in wanted if t not in leaves]
        if missing or not wanted:
            raise LoraError(f"lora_targets: {', '.join(missing) or repr(targets)} match(es) no linear layer of "
                            f"{type(model).__name__}; its linear layers: {', '.join(sorted(leaves)) or 'none'} "
                            f"(or '{DEFAULT_TARGETS}', 'all-linear')")
        return wanted
    names = sorted({n.rsplit(".", 1)[-1] for n in chosen})
    if not names:
        raise LoraError(f"lora_targets: {targets!r} matches no linear layer of {type(model).__name__} "
                        f"(its linear layers: {', '.join(linear) or 'none'}); peft cannot add LoRA adapters to it")
    return names


@contextlib.contextmanager
def peft_quiet():
    """peft 0.21 asks transformers 5 a deprecated question (is_gradient_checkpointing) on every wrap."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        yield


def add_adapters(model: torch.nn.Module, spec: LoraSpec, *, base_name: str, seed: int = 0):
    """Inject LoRA adapters into `model` in place (its base frozen, adapters fp32); returns the PeftModel.

    The adapters' initial values (B = 0, A random) come from `seed` alone, as the model's do. `base_name`
    is recorded as the adapter's base model (adapter_config.json), in the form load_model_and_tokenizer
    reads (a built-in name, a directory, a hub id)."""
    from peft import LoraConfig, get_peft_model

    targets = target_names(model, spec.targets)
    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout, target_modules=targets,
                        bias="none")
    try:
        with peft_quiet(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            peft_model = get_peft_model(model, config)
    except (ValueError, TypeError, NotImplementedError) as e:
        raise LoraError(f"{type(model).__name__}: peft cannot add LoRA adapters to it "
                        f"({type(e).__name__}: {str(e).splitlines()[0]})") from None
    peft_model.peft_config["default"].base_model_name_or_path = base_name  # not the loader's cache path
    return peft_model


def trainable_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """(name, parameter) of every parameter that trains: the adapters under LoRA, all of them otherwise."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def parameter_counts(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameters."""
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for _, p in trainable_parameters(model)), total


def trainable_line(policy) -> str:
    """The start-of-run line: trainable / total parameters, and the adapters' shape under LoRA."""
    trained, total = parameter_counts(policy.model)
    line = (f"[model] {type(policy.model).__name__}: {trained:,} of {total:,} parameters train "
            f"({100 * trained / total:.2f}%)")
    if policy.peft is not None:
        c = policy.peft.peft_config["default"]
        line += f"; LoRA rank {c.r}, alpha {c.lora_alpha:g} on {', '.join(sorted(c.target_modules))}"
    return line


@contextlib.contextmanager
def adapters_disabled(peft_model):
    """The base model's function for the duration (the adapters stay in memory, untouched)."""
    with peft_model.disable_adapter():
        yield


class AdaptersOff:
    """The KL reference of a LoRA run: the policy's own model with its adapters disabled, so the
    reference costs no second copy of the base. Has the one method the loss needs (`forward`)."""

    def __init__(self, policy):
        self.policy = policy

    def forward(self, *args, **kwargs):
        with adapters_disabled(self.policy.peft):
            return self.policy.forward(*args, **kwargs)


def load_adapter_weights(peft_model, path: str | Path) -> None:
    """Copy the adapter tensors saved in `path` (a peft adapter folder) into `peft_model`'s adapters, every one
    of them and nothing else (check_adapter_state)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    try:
        state = load_file(str(Path(path) / ADAPTER_WEIGHTS))
    except Exception as e:  # missing, cut short, not safetensors
        raise LoraError(f"{Path(path) / ADAPTER_WEIGHTS}: unreadable ({type(e).__name__}: {e})") from None
    check_adapter_state(peft_model, state, path)
    set_peft_model_state_dict(peft_model, state)


def check_adapter_state(peft_model, state: dict[str, torch.Tensor], path: str | Path) -> None:
    """Refuse saved adapter tensors that do not fill `peft_model`'s adapters exactly, key for key and shape
    for shape: peft itself loads a partial or foreign state with a warning (the missing adapters stay at
    B = 0 and compute nothing) and fails another rank with a torch size mismatch."""
    from peft import get_peft_model_state_dict

    want = get_peft_model_state_dict(peft_model, save_embedding_layers=False)  # "auto" asks the hub
    missing = [k for k in want if k not in state]
    foreign = [k for k in state if k not in want]
    shaped = [f"{k} is {tuple(state[k].shape)}, here {tuple(want[k].shape)}"
              for k in want if k in state and state[k].shape != want[k].shape]
    if missing or foreign or shaped:
        parts = [f"{len(v)} {what} (first: {v[0]})" for what, v in
                 (("missing", missing), ("not adapters of this model", foreign), ("of another shape", shaped)) if v]
        raise LoraError(f"{Path(path) / ADAPTER_WEIGHTS}: the weights do not fit the adapters "
                        f"{ADAPTER_CONFIG} asks for (or the run's --lora-rank/--lora-targets): {'; '.join(parts)}")


def adapter_base(path: str | Path) -> str:
    """The base model an adapter folder names (adapter_config.json's base_model_name_or_path; itself an
    adapter when adapters are stacked). The chain is followed to its end first: one that comes back to one
    of its own folders is refused (loading it would recurse without end)."""
    chain, here, bases = [], str(path), []
    while is_adapter_dir(here):
        real = os.path.realpath(here)
        if real in chain:
            raise LoraError(f"{Path(path) / ADAPTER_CONFIG}: base_model_name_or_path leads back to {here} "
                            f"({' -> '.join(chain + [real])}); name the base model the adapter was trained on")
        chain.append(real)
        config = Path(here) / ADAPTER_CONFIG
        try:
            base = json.loads(config.read_text())["base_model_name_or_path"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise LoraError(f"{config}: no base_model_name_or_path ({type(e).__name__}: {e})") from None
        if not isinstance(base, str) or not base:
            raise LoraError(f"{config}: base_model_name_or_path is {base!r}, not a model name or folder")
        here = base
        bases.append(base)
    return bases[0]


def adapter_on(model: torch.nn.Module, path: str | Path):
    """`model` with the adapter saved in `path` added (a PeftModel), or LoraError when the adapter's own
    config does not apply to this model or its weights do not fill what the config asks for."""
    from peft import LoraConfig, get_peft_model

    try:
        config = LoraConfig.from_pretrained(str(path))
    except Exception as e:
        raise LoraError(f"{Path(path) / ADAPTER_CONFIG}: not a LoRA config peft reads "
                        f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    try:
        with peft_quiet(), torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*base_model_name_or_path. was renamed")  # kept as saved
            peft_model = get_peft_model(model, config)  # its random init is overwritten below
    except (ValueError, TypeError, NotImplementedError) as e:
        raise LoraError(f"{Path(path) / ADAPTER_CONFIG}: its target_modules {sorted(config.target_modules or [])} "
                        f"do not apply to {type(model).__name__} ({type(e).__name__}: {str(e).splitlines()[0]})"
                        ) from None
    load_adapter_weights(peft_model, path)
    return peft_model


def save_adapter(peft_model, path: str) -> None:
    """adapter_config.json + adapter_model.safetensors. No embedding layers: adapters never train them,
    and peft's "auto" would look the base model up on the hub to find out."""
    peft_model.save_pretrained(path, save_embedding_layers=False)


def is_adapter_dir(path: str) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


@torch.no_grad()
def merged_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The plain model's state dict with every adapter merged into its base weight (base + scale x B @ A,
    in the base's dtype); the model itself is not changed. Names are the plain HF model's."""
    from peft.tuners.lora import LoraLayer

    out = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            base = module.get_base_layer()
            delta = sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)
            out[f"{name}.weight"] = (base.weight.float() + delta.float()).to(base.weight.dtype)
    for name, t in model.state_dict().items():
        if "lora_" not in name:
            out.setdefault(name.replace(".base_layer.", "."), t)
    return out


def save_merged(model: torch.nn.Module, tokenizer, path: str | Path) -> None:
    """A plain HF model directory (transformers alone loads it) holding the merged weights."""
    from transformers import AutoModelForCausalLM

    state = merged_state(model)
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(model.config)
    plain.load_state_dict(state, assign=True, strict=False)  # non-persistent buffers (rotary) are not in it
    plain.tie_weights()
    missing = [n for n, p in plain.named_parameters() if p.is_meta]
    if missing:
        raise RuntimeError(f"merged model: no merged value for {', '.join(missing[:3])}")
    plain.generation_config = model.generation_config
    plain.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
