"""Fitting a reward model (launch/train_reward_model.py): a causal LM's body with a 1-logit sequence-classification
head, fitted on labelled rows (BCE) or preference pairs (Bradley-Terry), saved as a folder --reward-model loads.

A plain loop, not TRL's RewardTrainer: that trainer covers preference pairs only (the labelled rows the policy's
own samples give would need a second path), and it brings the Trainer/accelerate machinery for what is here
forty lines. Scores are computed exactly as the reward model computes them when it scores (rewards/model.py:
the same rendering, left cut and head), so what is fitted is what is served.
"""

import contextlib
import json
import math
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from nanorllm.config.checks import bound_problems
from nanorllm.config.fields import (AdamWSettings, Devices, EpisodeShape, ModelSettings, Seeding, Steps,
                                    TrainingTasks)
from nanorllm.rewards.model import batch_tensors, encode, head_scores, pad_id
from nanorllm.supervised.data import RewardDataError, pairs_from_labelled, read_rows
from nanorllm.utils.devices import configure_threads
from nanorllm.utils.files import write_atomic, write_folder_atomic


class FitError(RuntimeError):
    """A fit whose model cannot be saved (its weights went non-finite)."""


@dataclass
class FitSettings:
    """What only the reward-model program reads: its rows, its batches, its modes."""

    out: str | None = None
    """Fitting: the folder the reward model is saved to (whole or not at all; a folder there is replaced only if it
    holds a fit's fit.json). --sample-from / --to-pairs: the JSONL file the rows go to."""
    data: str | None = None
    """JSONL rows {prompt, response, label} (label 0/1: BCE) or {prompt, chosen, rejected} (Bradley-Terry)."""
    batch_size: int = 8
    """Rows per optimizer step (a pair counts once)."""
    max_tokens: int = 512
    """Longest rendered (prompt, response); a longer one loses its first tokens (as when it scores)."""
    eval_frac: float = 0.1
    """Share of the rows held out; their accuracy (labelled: sign of the score; pairs: chosen above rejected) is
    printed."""
    sample_from: str | None = None
    """Make labelled rows instead: responses of this policy model on --tasks, graded by the math env (1 correct,
    0 not)."""
    samples_per_task: int = 8
    """--sample-from: responses per task, sampled at temperature 1.0 with --seed."""
    to_pairs: bool = False
    """Instead of fitting: --data's labelled rows as preference pairs of the same prompt (each response labelled 1
    against each labelled 0, identical texts once), written to --out: Bradley-Terry fits the ranking within a prompt,
    the comparison GRPO's groups make."""
    pairs_per_prompt: int = 4
    """--to-pairs: at most this many pairs a prompt."""
    score: str | None = None
    """Instead of fitting: the accuracy of this reward model folder on every row of --data (labelled: the score's
    sign; pairs: chosen above rejected), scored as --reward-model scores, printed as one JSON line; --out is unused."""


@dataclass
class FitConfig(FitSettings, EpisodeShape, Steps, AdamWSettings, TrainingTasks, Seeding, Devices, ModelSettings):
    """Fit a reward model on --data; or make its labelled data (--sample-from), turn labelled rows into pairs
    (--to-pairs), or score a fitted one (--score) (docs/rewards.md). The shared groups mean what they mean in
    training: --model (the causal LM the reward model starts from), --dtype (bf16 autocast over fp32 weights),
    --threads, --devices (its first entry), --seed (the held-out split, the row order, the new head, the sampling),
    AdamW's --lr, --weight-decay, --max-grad-norm, --epochs (passes over the rows) and --max-steps (a cap on the
    optimizer steps those passes make, 0: none), --tasks and --limit (--sample-from's tasks: the math env's
    training tasks, never its held-out set), and the episode's shape --sample-from samples with (--max-new-tokens,
    --system-prompt, --worked-example, --grader-timeout-s; --max-turns must stay 1: a row is the question and
    one response)."""


# This program's own defaults: values, not second declarations of those fields.
# weight_decay 0.01 is torch AdamW's own default, which the published fits used.
FIT_DEFAULTS = {"lr": 1e-5, "limit": 64, "max_steps": 0, "weight_decay": 0.01, "max_turns": 1}


def problems(cfg: FitConfig) -> list[str]:
    counts = ("epochs", "batch_size", "max_tokens", "limit", "samples_per_task", "max_new_tokens", "pairs_per_prompt")
    p = bound_problems(cfg, {**dict.fromkeys(counts, ">= 1"), "lr": "> 0", "max_steps": ">= 0", "weight_decay": ">= 0",
                             "max_grad_norm": "> 0", "threads": ">= 1 or unset", "grader_timeout_s": "> 0"})
    if not math.isfinite(cfg.lr):  # bound_problems lets inf through
        p = [q for q in p if not q.startswith("lr:")] + [f"lr: must be a finite number > 0, got {cfg.lr}"]
    if not 0 <= cfg.eval_frac < 1:
        p.append(f"eval_frac: must be in [0, 1), got {cfg.eval_frac}")
    if cfg.max_turns != 1:
        p.append(f"max_turns: --sample-from labels one-turn episodes (a row is the question and one response), "
                 f"got {cfg.max_turns}")
    if (cfg.data is None) == (cfg.sample_from is None):
        p.append("data: give --data (fit a reward model) or --sample-from (make labelled rows), one of them")
    if cfg.to_pairs and cfg.score is not None:
        p.append("to_pairs: --to-pairs makes data and --score scores a model: one of them")
    if (cfg.to_pairs or cfg.score is not None) and cfg.sample_from is not None:
        p.append(f"sample_from: --{'to-pairs' if cfg.to_pairs else 'score'} reads --data rows, not --sample-from")
    if cfg.out is None and cfg.score is None:
        p.append("out: required (where the model, the rows or the pairs go)")
    return p


def out_problems(cfg: FitConfig) -> list[str]:
    """Why a fit could not save to --out: a file there, or a folder that is not an earlier fit (never replaced)."""
    out = Path(cfg.out)
    if cfg.sample_from is not None or cfg.to_pairs or cfg.score is not None or not out.exists():
        return []
    if not out.is_dir():
        return [f"out: {cfg.out!r} is a file; a reward model is a folder"]
    if any(out.iterdir()) and not (out / "fit.json").exists():
        return [f"out: {cfg.out!r} is a folder of other files (no fit.json); give a new or empty folder"]
    return []


def write_pairs(cfg: FitConfig, say=print) -> list[dict]:
    """--to-pairs: --data's labelled rows as pairs in --out (written whole or not at all)."""
    kind, rows = read_rows(cfg.data)
    if kind != "labelled":
        raise RewardDataError([f"{cfg.data}: --to-pairs reads labelled rows, these are {kind}"])
    pairs = pairs_from_labelled(rows, cfg.pairs_per_prompt)
    if not pairs:
        raise RewardDataError([f"{cfg.data}: no prompt has both a response labelled 1 and one labelled 0"])
    out = Path(cfg.out)
    write_atomic(out, "".join(json.dumps(x) + "\n" for x in pairs))
    say(f"[pairs] {len(pairs)} pairs from {len({json.dumps(x['prompt']) for x in pairs})} prompts "
        f"({len(rows)} labelled rows) | written to {out}")
    return pairs


def score_rows(cfg: FitConfig) -> dict:
    """--score: {"model", "data", "kind", "rows", "accuracy"} of the reward model folder cfg.score on cfg.data."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    kind, rows = read_rows(cfg.data)
    tokenizer = AutoTokenizer.from_pretrained(cfg.score, trust_remote_code=False)
    model = AutoModelForSequenceClassification.from_pretrained(cfg.score, trust_remote_code=False).eval()
    model.to(fit_device(cfg))
    return {"model": cfg.score, "data": cfg.data, "kind": kind, "rows": len(rows),
            "accuracy": accuracy(model, tokenizer, kind, rows, cfg)}


def load_classifier(name: str):
    """(sequence classifier with a fresh 1-logit head, tokenizer) from a causal LM name or folder."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from nanorllm.policy.models import SMOLLM2, TINY, ensure_smollm2, load_model_and_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        path = ensure_smollm2() if name == SMOLLM2 else name
        if name == TINY:  # built in memory: through a folder, as any causal LM is read
            model, tokenizer = load_model_and_tokenizer(TINY)
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            path = tmp
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, trust_remote_code=False)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    pad_id(model, tokenizer)
    return model, tokenizer


def scores(model, tokenizer, prompts: list, responses: list[str], max_tokens: int) -> torch.Tensor:
    """(B,) scores, with gradients when enabled."""
    rows = [encode(tokenizer, p, r, max_tokens) for p, r in zip(prompts, responses)]
    ids, mask = batch_tensors(rows, model.config.pad_token_id, model.device)
    return head_scores(model(input_ids=ids, attention_mask=mask).logits).float()


def batch_loss_and_hits(model, tokenizer, kind: str, batch: list[dict], max_tokens: int) -> tuple[torch.Tensor, int]:
    """(the batch's mean loss, rows scored right)."""
    prompts = [r["prompt"] for r in batch]
    if kind == "pairs":
        margin = (scores(model, tokenizer, prompts, [r["chosen"] for r in batch], max_tokens)
                  - scores(model, tokenizer, prompts, [r["rejected"] for r in batch], max_tokens))
        return -F.logsigmoid(margin).mean(), int((margin > 0).sum())
    s = scores(model, tokenizer, prompts, [r["response"] for r in batch], max_tokens)
    labels = torch.tensor([float(r["label"]) for r in batch])
    return F.binary_cross_entropy_with_logits(s, labels), int(((s > 0).float() == labels).sum())


def accuracy(model, tokenizer, kind: str, rows: list[dict], cfg: FitConfig) -> float | None:
    if not rows:
        return None
    with torch.no_grad():
        hits = sum(batch_loss_and_hits(model, tokenizer, kind, rows[i:i + cfg.batch_size], cfg.max_tokens)[1]
                   for i in range(0, len(rows), cfg.batch_size))
    return hits / len(rows)


def save(model, tokenizer, summary: dict, folder: Path) -> None:
    """The reward model's folder: weights, tokenizer and fit.json (the summary), fit.json last."""
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "fit.json").write_text(json.dumps(summary, indent=2) + "\n")


def fit_device(cfg: FitConfig) -> str:
    """--devices' first entry (auto: the first GPU, else the CPU), with this process's CPU threads set."""
    from nanorllm.supervised.sft import learner_device

    device = learner_device(cfg.devices)
    configure_threads(device, cfg.threads, 1)
    return device


def compute_precision(cfg: FitConfig, device: str):
    """--dtype as the learner computes: bf16 autocast over fp32 weights, or nothing."""
    from nanorllm.policy.hf_causal import DTYPES

    if DTYPES[cfg.dtype] == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=DTYPES[cfg.dtype])


def fit(cfg: FitConfig, say=print) -> dict:
    """Fit on cfg.data, save to cfg.out (model, tokenizer, fit.json); the summary fit.json holds."""
    kind, rows = read_rows(cfg.data)
    rng = random.Random(cfg.seed)
    rng.shuffle(rows)
    held = int(len(rows) * cfg.eval_frac)
    held_out, train = rows[:held], rows[held:]
    device = fit_device(cfg)
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_classifier(cfg.model)
    model.to(device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                                  weight_decay=cfg.weight_decay)
    say(f"[fit] {len(train)} {kind} rows to fit, {len(held_out)} held out on {device}; held-out accuracy before: "
        f"{accuracy(model.eval(), tokenizer, kind, held_out, cfg)}")
    losses = []
    for epoch in range(cfg.epochs):
        if cfg.max_steps and len(losses) == cfg.max_steps:
            break
        model.train()
        rng.shuffle(train)
        first = len(losses)
        for i in range(0, len(train), cfg.batch_size):
            if cfg.max_steps and len(losses) == cfg.max_steps:
                break
            with compute_precision(cfg, device):
                loss, _ = batch_loss_and_hits(model, tokenizer, kind, train[i:i + cfg.batch_size], cfg.max_tokens)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            losses.append(loss.item())
        epoch_losses = losses[first:] or [math.nan]
        say(f"[fit] epoch {epoch + 1}/{cfg.epochs}: mean loss {sum(epoch_losses) / len(epoch_losses):.4f}")
    model.eval()
    bad = [name for name, w in model.named_parameters() if not torch.isfinite(w).all()]
    if bad:
        raise FitError(f"the fit left {len(bad)} weights non-finite (first: {bad[0]}); nothing saved: lower --lr")
    summary = {"kind": kind, "train_rows": len(train), "held_out_rows": len(held_out), "losses": losses,
               "held_out_accuracy": accuracy(model, tokenizer, kind, held_out, cfg)}
    out = Path(cfg.out)
    write_folder_atomic(out, lambda tmp: save(model, tokenizer, summary, tmp))
    name = "pairwise accuracy" if kind == "pairs" else "accuracy"
    say(f"[fit] held-out {name}: {summary['held_out_accuracy']} | saved to {out} (--reward-model {out})")
    return summary
