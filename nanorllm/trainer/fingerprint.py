"""What a checkpoint resumes: a fingerprint of its task order, and the options that fixed its model.

The exactly-once ledger is a task-stream position (trainer/checkpoint.py), which means something
only for the task order it counted: another task file (one line appended), another seed, limit or
held-out set reshuffles every epoch, and a resume would train some groups twice and others never.
So each checkpoint records the order's fingerprint, and a resume with another one is refused naming
what changed, unless `--resume-new-data` accepts it: the new order then starts at a new epoch.

The model's weights and tokenizer come from the checkpoint, so `--model` and `--dtype` cannot change
on resume: given anyway, they are refused rather than half-applied (workers loading one model while
the learner trains another). Nor can `--max-prompt-tokens` and `--drop-long-prompts`: they decide which
tasks are left out of the stream after its fingerprint is taken. Nor can LoRA's shape (`--lora-rank`,
`--lora-alpha`, `--lora-targets`): a checkpoint holds either a whole model or adapters of one rank on one
set of layers, and the optimizer state is the state of exactly those tensors.
"""

import hashlib
import json

# the prompt limit decides which tasks the stream holds after the order's fingerprint is taken
FIXED_ON_RESUME = ("model", "dtype", "max_prompt_tokens", "drop_long_prompts", "lora_rank", "lora_alpha",
                   "lora_targets")
_BEFORE_LORA = {"lora_rank": 0, "lora_alpha": None, "lora_targets": "attn-mlp"}  # a checkpoint older than LoRA
_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
_LABELS = {"tasks": "training tasks (--tasks, --limit)",
           "held_out_removed": "training tasks removed as held out (--eval-tasks, --eval-limit)",
           "seed": "task-order seed (--seed)"}


def digest(tasks: list[dict]) -> dict:
    """{"n", "sha256"} of the tasks' ids, questions and answers, in order (and, for another env's rows, their
    other fields, sorted by name)."""
    rows = json.dumps([[t["task_id"], t.get("question"), t.get("answer"),
                        *sorted((k, v) for k, v in t.items() if k not in ("task_id", "question", "answer"))]
                       for t in tasks], ensure_ascii=False, default=str)
    return {"n": len(tasks), "sha256": hashlib.sha256(rows.encode()).hexdigest()}


def task_order(loaded: list[dict], removed: list[dict], seed: int) -> dict:
    """The fingerprint of the order a TaskStream over `loaded` minus `removed` hands tasks out in."""
    return {"tasks": digest(loaded), "held_out_removed": digest(removed), "seed": seed}


def _show(v) -> str:
    return f"{v['n']} tasks, sha256 {v['sha256'][:12]}" if isinstance(v, dict) else str(v)


def order_changes(saved: dict | None, now: dict) -> list[str]:
    """One line per part of the task order that differs from the checkpoint's (none for a checkpoint
    written before fingerprints)."""
    if saved is None:
        return []
    return [f"{_LABELS[k]}: {_show(now[k])} now, {_show(saved.get(k))} in the checkpoint"
            for k in _LABELS if saved.get(k) != now[k]]


def fixed_changes(saved_cfg: dict, cfg: dict) -> list[str]:
    """One line per option that cannot change on resume and was given another value."""
    saved_cfg = {**_BEFORE_LORA, **saved_cfg}

    def norm(k, v):
        if k == "lora_alpha":  # unset means 2 x rank (policy/lora.py)
            return float(2 * saved_cfg["lora_rank"] if v is None else v)
        return _DTYPES.get(v, v) if k == "dtype" else v

    full = not cfg.get("lora_rank") and not saved_cfg["lora_rank"]  # alpha and targets mean nothing to it
    fixed = [k for k in FIXED_ON_RESUME if not (full and k in ("lora_alpha", "lora_targets"))]
    return [f"{k}: {cfg[k]!r} given, the checkpoint was trained with {saved_cfg[k]!r}; it cannot change on resume"
            for k in fixed if k in saved_cfg and k in cfg and norm(k, saved_cfg[k]) != norm(k, cfg[k])]
