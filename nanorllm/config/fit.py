"""The reward-model program's config (launch/train_reward_model.py, supervised/fit.py): the training groups it reads,
composed as TrainConfig composes them, and one group of its own (`FitSettings`); its own defaults (`FIT_DEFAULTS`)
are values, not second declarations of those fields."""

import math
from dataclasses import dataclass

from nanorllm.config.checks import bound_problems
from nanorllm.config.fields import (AdamWSettings, Devices, EpisodeShape, ModelSettings, Passes, RunLog, Seeding,
                                    Steps, TrainingTasks)
from nanorllm.config.sft import Overwriting, Resuming


@dataclass
class FitSettings:
    """What only the reward-model program reads: its rows, its batches, its modes."""

    out: str | None = None
    """Fitting: the folder the reward model is saved to (whole or not at all; a folder there is replaced only if it
    holds a fit's fit.json, or with --overwrite). --sample-from / --to-pairs: the JSONL file the rows go to (an
    existing file only with --overwrite)."""
    data: str | None = None
    """JSONL rows {prompt, response, label} (label 0/1: BCE) or {prompt, chosen, rejected} (Bradley-Terry)."""
    batch_size: int = 8
    """Rows per optimizer step (a pair counts once), computed in passes of at most --micro-batch-tokens padded
    tokens (a pair's two rows in one pass)."""
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
class FitConfig(FitSettings, Overwriting, Resuming, RunLog, Passes, EpisodeShape, Steps, AdamWSettings, TrainingTasks, Seeding,
                Devices, ModelSettings):
    """Fit a reward model on --data; or make its labelled data (--sample-from), turn labelled rows into pairs
    (--to-pairs), or score a fitted one (--score) (docs/rewards.md). The shared groups mean what they mean in
    training: --model (the causal LM the reward model starts from), --dtype (bf16 autocast over fp32 weights),
    --threads, --devices (its first entry), --seed (the held-out split, the row order, the new head, the sampling),
    AdamW's --lr, --weight-decay, --max-grad-norm, --epochs (passes over the rows) and --max-steps (a cap on the
    optimizer steps those passes make, 0: none), the learner's passes (--micro-batch-tokens, --max-pad-frac,
    --tf32), the run folder (--output-dir, --run-name, --exp-name; --report-to's sinks get fit/loss each step and
    fit/held_out_accuracy every --eval-every steps; --save-every, --keep-checkpoints: the training run's
    checkpoints, which --resume continues from), --tasks and --limit (--sample-from's tasks: the math env's
    training tasks, never its held-out set), and the episode's shape --sample-from samples with (--max-new-tokens,
    --system-prompt, --worked-example, --grader-timeout-s; --max-turns must stay 1: a row is the question and
    one response)."""


# This program's own defaults: values, not second declarations of those fields.
# weight_decay 0.01 is torch AdamW's own default, which the published fits used.
FIT_DEFAULTS = {"lr": 1e-5, "limit": 64, "max_steps": 0, "weight_decay": 0.01, "max_turns": 1,
                "exp_name": "reward_model"}


def problems(cfg: FitConfig) -> list[str]:
    counts = ("epochs", "batch_size", "max_tokens", "limit", "samples_per_task", "max_new_tokens", "pairs_per_prompt",
              "keep_checkpoints")
    p = bound_problems(cfg, {**dict.fromkeys(counts, ">= 1"), **dict.fromkeys(("max_steps", "save_every", "eval_every"),
                                                                             ">= 0"),
                             "lr": "> 0", "weight_decay": ">= 0", "max_grad_norm": "> 0", "threads": ">= 1 or unset",
                             "micro_batch_tokens": ">= 1 or unset", "grader_timeout_s": "> 0"})
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
    if cfg.resume is not None and (cfg.to_pairs or cfg.score is not None or cfg.sample_from is not None):
        p.append("resume: continues a fit; --to-pairs, --score and --sample-from make no checkpoints")
    if (cfg.to_pairs or cfg.score is not None) and cfg.sample_from is not None:
        p.append(f"sample_from: --{'to-pairs' if cfg.to_pairs else 'score'} reads --data rows, not --sample-from")
    if cfg.out is None and cfg.score is None:
        p.append("out: required (where the model, the rows or the pairs go)")
    return p
