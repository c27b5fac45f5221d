"""Checkpoints: runs/<run>/checkpoints/step_<N>/ with

    model/               HF format (safetensors + config + tokenizer); under LoRA the adapter alone, in
                         peft's format (adapter_config.json + adapter_model.safetensors + tokenizer)
    optimizer.pt         optimizer state_dict: tensors and numbers only, loaded with weights_only=True;
                         the full, plain one on any number of ranks (gathered from FSDP's shards)
    rng.pt               torch and sampler RNG states, weights_only=True
    trainer_state.json   step, task-stream position (and where the current task order's epoch 0 began),
                         python RNG state, counters, config, the task order's fingerprint (trainer/fingerprint.py),
                         with --task-sampler signal its estimates ("sampler": datasets/sampler.py's state())
    manifest.json        every other file's size and sha256, written last

The task-stream position is the exactly-once ledger: every group is named by the position it was
drawn at (`<task_id>@<position>`), and steps train the stream in order, so "trained" is exactly
"position < stream_position". It is the position before step `step`'s tasks were drawn, even when
a pipeline had later steps in flight or a stop interrupted a rollout: those groups are drawn again
on resume and trained once.

Written under a temporary name (`step_<N>.tmp`, utils/files.py write_folder_atomic); the files, the
manifest and the directory are fsynced, and only then is it renamed: a crash or a full disk mid-write never leaves a directory that looks like a
checkpoint. On resume every file is checked against the manifest before anything is parsed, so a
checkpoint damaged later (a file cut short, overwritten, emptied) is reported in one line and the
previous one is used; the damaged one is set aside as `damaged-step_<N>/`, so that --keep-checkpoints
counts only whole ones (each save also checks the sizes of those it counts). Nothing here unpickles code.
"""

import errno
import hashlib
import json
import os
import random
import shutil
import time
from pathlib import Path

import torch

from nanorllm.datasets.stream import TaskStream
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.utils.faults import fault
from nanorllm.utils.files import fsync_dir, write_folder_atomic

PREFIX = "step_"
FILES = ("optimizer.pt", "rng.pt", "trainer_state.json")
MODEL_CONFIGS = ("model/config.json", "model/adapter_config.json")  # a whole model, or a LoRA adapter
MANIFEST = "manifest.json"
DAMAGED = "damaged-"  # a damaged checkpoint's folder, set aside: damaged-step_<N>


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


def complete_steps(run_dir: Path) -> list[int]:
    """The steps of the complete-looking checkpoints, oldest first."""
    return [int(p.name[len(PREFIX):]) for p in list_complete(run_dir)]


def clean_stale(run_dir: Path) -> list[Path]:
    """Remove what a process that died mid-write left in `run_dir`: `checkpoints/step_<N>.tmp` folders (and
    `.tmp-*`, the name older versions wrote them under) and `*.tmp` files and folders. Only the holder of the run
    folder's lock may call it: nobody else writes there."""
    run_dir = Path(run_dir)
    ckpts = checkpoints_dir(run_dir)
    stale = sorted([*ckpts.glob("*.tmp"), *ckpts.glob(".tmp-*")]) + sorted(run_dir.glob("*.tmp"))
    for p in stale:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
    return stale


def save(run_dir: Path, step: int, *, config: dict, keep: int, policy: HFCausalPolicy, optimizer_state: dict,
         stream_position: int, stream_origin: int, task_order: dict, totals: dict,
         sampler: dict | None = None) -> Path:
    """Write checkpoint `step` of the run in `run_dir` and keep the newest `keep`. `config`: the run's
    fields as saved (TrainConfig.saved()); `stream_position`: before `step`'s tasks were drawn;
    `stream_origin` and `task_order`: where the current task order's epoch 0 began, and its fingerprint;
    `sampler`: the task sampler's state (the signal sampler's estimates; empty or None: none is written)."""
    final = checkpoints_dir(run_dir) / f"{PREFIX}{step}"
    final.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "step": step, "stream_position": stream_position,
        "python_rng": _jsonable(random.getstate()), "totals": totals, "config": config,
        "reference_model": config["model"], "task_order": task_order, "stream_origin": stream_origin,
    }
    if sampler:
        state["sampler"] = sampler
    write_folder_atomic(final, lambda tmp: _write(tmp, step, policy, optimizer_state, state))
    prune(run_dir, keep)
    return final


def prune(run_dir: Path, keep: int) -> None:
    """Keep the newest `keep` whole checkpoints. One whose files are not the sizes its manifest lists is
    set aside first, so a damaged checkpoint never takes the place of a good one (a full check of every
    hash here would reread gigabytes each save; the resume's check, load_latest, sets aside the rest)."""
    for ckpt in list_complete(run_dir):
        try:
            verify_manifest(ckpt, hashes=False)
        except CheckpointError as e:
            print(f"[checkpoint] {set_aside(ckpt, e)}", flush=True)
    for old in list_complete(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def set_aside(ckpt: Path, problem: CheckpointError) -> str:
    """Rename a damaged checkpoint to `damaged-step_<N>/` beside the others: kept for a look, no longer tried
    by a resume nor counted by --keep-checkpoints (a later save of its step writes a new one). Returns the
    line that says so."""
    target = ckpt.with_name(DAMAGED + ckpt.name)
    shutil.rmtree(target, ignore_errors=True)
    os.rename(ckpt, target)
    return f"{problem}; set aside as {target.name} (not counted by --keep-checkpoints)"


def _write(tmp: Path, step: int, policy: HFCausalPolicy, optimizer_state: dict, state: dict) -> None:
    policy.save(str(tmp / "model"))
    time.sleep(float(fault("slow_save") or 0))
    if fault("disk_full") == str(step):
        raise OSError(errno.ENOSPC, f"No space left on device (injected fault: disk_full {step})")
    torch.save(optimizer_state, tmp / "optimizer.pt")
    torch.save({"torch": torch.get_rng_state(), "sampler": policy.generator.get_state()}, tmp / "rng.pt")
    (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2) + "\n")
    write_manifest(tmp)


# ---- manifest: what a complete checkpoint holds ---------------------------------------------------
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(ckpt_dir: Path) -> dict:
    """Fsync every file under `ckpt_dir` and its folders, then write and fsync manifest.json listing each
    file's size and sha256. Call it last, before the rename that publishes the checkpoint."""
    ckpt_dir = Path(ckpt_dir)
    files = {}
    for path in sorted(p for p in ckpt_dir.rglob("*") if p.is_file() and p.name != MANIFEST):
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        files[path.relative_to(ckpt_dir).as_posix()] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    manifest = {"files": files}
    with open(ckpt_dir / MANIFEST, "w") as f:
        f.write(json.dumps(manifest, indent=1) + "\n")
        f.flush()
        os.fsync(f.fileno())
    for d in sorted({p.parent for p in ckpt_dir.rglob("*")} | {ckpt_dir}, key=lambda p: -len(p.parts)):
        fsync_dir(d)
    return manifest


def verify_manifest(ckpt_dir: Path, *, hashes: bool = True) -> None:
    """Raise CheckpointError naming the first file that is missing, of another size, or (with `hashes`) of
    another hash."""
    ckpt_dir = Path(ckpt_dir)
    try:
        files = json.loads((ckpt_dir / MANIFEST).read_text())["files"]
    except FileNotFoundError:
        raise CheckpointError(f"{ckpt_dir}: no {MANIFEST} (incomplete, or written before manifests)") from None
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{ckpt_dir}: {MANIFEST} unreadable ({type(e).__name__}: {e})") from None
    for name, want in files.items():
        path = ckpt_dir / name
        if not path.is_file():
            raise CheckpointError(f"{ckpt_dir}: {name} missing (listed in {MANIFEST})")
        if path.stat().st_size != want["size"]:
            raise CheckpointError(f"{ckpt_dir}: {name} is {path.stat().st_size} bytes, {want['size']} were written")
        if hashes and _sha256(path) != want["sha256"]:
            raise CheckpointError(f"{ckpt_dir}: {name} changed since it was written (sha256 differs)")


def _jsonable(x):
    return [_jsonable(v) for v in x] if isinstance(x, (tuple, list)) else x


def _tupled(x):
    return tuple(_tupled(v) for v in x) if isinstance(x, list) else x


def read(ckpt: Path) -> dict:
    """Load and check one checkpoint's non-model state; raises CheckpointError naming what is wrong."""
    verify_manifest(ckpt)
    for f in FILES:
        if not (ckpt / f).exists():
            raise CheckpointError(f"{ckpt}: missing {f}")
    if not any((ckpt / f).exists() for f in MODEL_CONFIGS):
        raise CheckpointError(f"{ckpt}: missing {MODEL_CONFIGS[0]}")
    try:
        state = json.loads((ckpt / "trainer_state.json").read_text())
        missing = [k for k in ("step", "stream_position", "python_rng") if k not in state]
        if missing:
            raise CheckpointError(f"{ckpt}: trainer_state.json lacks {', '.join(missing)}")
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
    """Newest checkpoint that loads; each one skipped is reported with its reason and set aside (set_aside).
    Only the holder of the run folder's lock may call it."""
    candidates = list_complete(run_dir)
    if not candidates:
        raise CheckpointError(f"{run_dir}: no complete checkpoint under {checkpoints_dir(run_dir)}")
    for ckpt in reversed(candidates):
        try:
            state = read(ckpt)
            print(f"[resume] from {ckpt} (step {state['step']})", flush=True)
            return ckpt, state
        except CheckpointError as e:
            print(f"[resume] skipping {set_aside(ckpt, e)}", flush=True)
    raise CheckpointError(f"{run_dir}: none of {len(candidates)} checkpoints could be loaded")


def saved_config(run_dir: Path) -> tuple[dict, str]:
    """(the run's config fields, where they came from): `<run>/config.json`, or when that is unreadable
    (emptied, cut short by a full disk) the config in the newest checkpoint whose trainer_state.json is
    intact by its manifest."""
    path = Path(run_dir) / "config.json"
    try:
        return json.loads(path.read_text()), str(path)
    except (OSError, ValueError) as e:
        problem = f"{path} unreadable ({type(e).__name__})"
    for ckpt in reversed(list_complete(run_dir)):
        try:
            files = json.loads((ckpt / MANIFEST).read_text())["files"]
            state_file = ckpt / "trainer_state.json"
            if _sha256(state_file) == files["trainer_state.json"]["sha256"]:
                return json.loads(state_file.read_text())["config"], f"{state_file} ({problem})"
        except (OSError, ValueError, KeyError, TypeError):
            continue
    raise CheckpointError(f"{problem}, and no checkpoint holds an intact config")


def restore(state: dict, *, policy: HFCausalPolicy, optimizer: torch.optim.Optimizer, stream: TaskStream,
            totals: dict) -> int:
    """Put a checkpoint's state (from `read`) back: optimizer, RNGs, task stream, counters. Returns the step
    to start from."""
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"]["torch"])
    policy.generator.set_state(state["rng"]["sampler"])
    random.setstate(_tupled(state["python_rng"]))
    stream.position = state["stream_position"]
    stream.origin = state.get("stream_origin", 0)
    stream.load_state(state.get("sampler", {}))  # a checkpoint of another sampler's: the estimates start afresh
    policy.version = state["step"]
    totals.update(state.get("totals", {}))
    return state["step"]
