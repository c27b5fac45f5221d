"""Checkpoints: runs/<run>/checkpoints/step_<N>/ with

    model/               HF format (safetensors + config + tokenizer)
    optimizer.pt         optimizer state_dict: tensors and numbers only, loaded with weights_only=True;
                         the full, plain one on any number of ranks (gathered from FSDP's shards)
    rng.pt               torch and sampler RNG states, weights_only=True
    trainer_state.json   step, task-stream position, python RNG state, counters, config

The task-stream position is the exactly-once ledger: every group is named by the position it was
drawn at (`<task_id>@<position>`), and steps train the stream in order, so "trained" is exactly
"position < stream_position". It is the position before step `step`'s tasks were drawn, even when
a pipeline had later steps in flight or a stop interrupted a rollout: those groups are drawn again
on resume and trained once.

Written under a temporary name and renamed when complete, so a crash mid-write never leaves a
directory that looks like a checkpoint; a checkpoint that fails to load is reported and the
previous one is used. Nothing here unpickles code.
"""

import json
import os
import random
import shutil
from dataclasses import asdict
from pathlib import Path

import torch

from nanorllm.config import TrainConfig
from nanorllm.datasets.stream import TaskStream
from nanorllm.policy.hf_causal import HFCausalPolicy

PREFIX = "step_"
FILES = ("model/config.json", "optimizer.pt", "rng.pt", "trainer_state.json")


class CheckpointError(RuntimeError):
    pass


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_complete(run_dir: Path) -> list[Path]:
    """Complete-looking checkpoints, oldest first (temporary directories are ignored)."""
    d = checkpoints_dir(run_dir)
    if not d.exists():
        return []
    found = [p for p in d.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def save(run_dir: Path, step: int, *, cfg: TrainConfig, policy: HFCausalPolicy, optimizer_state: dict,
         stream_position: int, totals: dict) -> Path:
    """Write checkpoint `step` of the run in `run_dir`; `stream_position`: before `step`'s tasks were drawn."""
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step}"
    tmp = root / f".tmp-{PREFIX}{step}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    policy.save(str(tmp / "model"))
    torch.save(optimizer_state, tmp / "optimizer.pt")
    torch.save({"torch": torch.get_rng_state(), "sampler": policy.generator.get_state()}, tmp / "rng.pt")
    state = {
        "step": step, "stream_position": stream_position,
        "python_rng": _jsonable(random.getstate()), "totals": totals, "config": asdict(cfg),
        "reference_model": cfg.model,
    }
    (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2) + "\n")
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    for old in list_complete(run_dir)[:-cfg.keep_checkpoints]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _jsonable(x):
    return [_jsonable(v) for v in x] if isinstance(x, (tuple, list)) else x


def _tupled(x):
    return tuple(_tupled(v) for v in x) if isinstance(x, list) else x


def read(ckpt: Path) -> dict:
    """Load and check one checkpoint's non-model state; raises CheckpointError naming what is wrong."""
    for f in FILES:
        if not (ckpt / f).exists():
            raise CheckpointError(f"{ckpt}: missing {f}")
    try:
        state = json.loads((ckpt / "trainer_state.json").read_text())
        state["optimizer"] = torch.load(ckpt / "optimizer.pt", weights_only=True, map_location="cpu")
        state["rng"] = torch.load(ckpt / "rng.pt", weights_only=True, map_location="cpu")
        if not any((ckpt / "model").glob("*.safetensors")):
            raise CheckpointError(f"{ckpt}: no safetensors weights in model/")
        from safetensors import safe_open
        for f in (ckpt / "model").glob("*.safetensors"):
            with safe_open(str(f), "pt") as st:  # reads the header: a truncated file fails here
                for k in list(st.keys())[-1:]:
                    st.get_tensor(k)
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"{ckpt}: unreadable ({type(e).__name__}: {e})") from e
    return state


def load_latest(run_dir: Path) -> tuple[Path, dict]:
    """Newest checkpoint that loads; each one skipped is reported with its reason."""
    candidates = list_complete(run_dir)
    if not candidates:
        raise CheckpointError(f"{run_dir}: no complete checkpoint under {checkpoints_dir(run_dir)}")
    for ckpt in reversed(candidates):
        try:
            state = read(ckpt)
            print(f"[resume] from {ckpt} (step {state['step']})", flush=True)
            return ckpt, state
        except CheckpointError as e:
            print(f"[resume] skipping {e}", flush=True)
    raise CheckpointError(f"{run_dir}: none of {len(candidates)} checkpoints could be loaded")


def restore(state: dict, *, policy: HFCausalPolicy, optimizer: torch.optim.Optimizer, stream: TaskStream,
            totals: dict) -> int:
    """Put a checkpoint's state (from `read`) back: optimizer, RNGs, task stream, counters. Returns the step
    to start from."""
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"]["torch"])
    policy.generator.set_state(state["rng"]["sampler"])
    random.setstate(_tupled(state["python_rng"]))
    stream.position = state["stream_position"]
    policy.version = state["step"]
    totals.update(state.get("totals", {}))
    return state["step"]
