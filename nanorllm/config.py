"""TrainConfig: the one source of truth for a run.

Defaults here -> overridden by `--config FILE` (JSON or YAML) -> overridden by command-line flags
(parsed by tyro from this dataclass, so every field is a flag: `max_steps` is `--max-steps`).
`validate()` reports every problem at once, naming the field, before any model or file is loaded.
"""

import difflib
import importlib.util
import json
import math
import os
import re
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from types import UnionType
from typing import Annotated, Literal, Union, get_args, get_origin, get_type_hints

import tyro

from nanorllm.algos.advantages import ESTIMATORS

DEFAULT_ENV_NAME = "math"  # TrainConfig.env's default (envs/registry.py DEFAULT_ENV)
# Limits where `inf` means "no limit" (documented on each field); every other number must be finite.
NO_LIMIT_FIELDS = ("worker_timeout_s", "worker_start_timeout_s", "learner_timeout_s")


class ConfigError(ValueError):
    def __init__(self, problems: list[str], source: str = "config"):
        self.problems = problems
        super().__init__(f"{len(problems)} problem(s) in {source}:\n" + "\n".join(f"  {p}" for p in problems))


def eval_problems(cfg) -> list[str]:
    """What is wrong with the evaluation fields (eval_samples, eval_k, eval_temperature, eval_set) of a TrainConfig
    or an EvalConfig, naming the field."""
    p = []
    if cfg.eval_samples is not None and cfg.eval_samples < 1:
        p.append(f"eval_samples: must be >= 1 or unset (greedy only), got {cfg.eval_samples}")
    elif cfg.eval_k and cfg.eval_samples is None:
        p.append(f"eval_k: {list(cfg.eval_k)} needs --eval-samples n >= its largest k")
    elif cfg.eval_samples is not None:
        bad = [k for k in cfg.eval_k if not 1 <= k <= cfg.eval_samples]
        if bad:
            p.append(f"eval_k: each k must be in 1..{cfg.eval_samples} (--eval-samples), got {bad}")
    if not cfg.eval_temperature > 0:
        p.append(f"eval_temperature: must be > 0, got {cfg.eval_temperature}")
    names = []
    for item in cfg.eval_set:
        name, sep, spec = item.partition("=")
        if not sep or not spec or not re.fullmatch(r"[a-z0-9_]+", name):
            p.append(f"eval_set: {item!r} is not name=spec with a name of a-z, 0-9 and _")
        elif name in names:
            p.append(f"eval_set: name {name!r} is given twice")
        names.append(name)
    return p


@dataclass
class TrainConfig:
    # --- what to train on ---
    model: str = "smollm2-135m-instruct"
    """Built-in name (smollm2-135m-instruct, tiny-random), a local HF model directory or a hub id."""
    env: str = "math"
    """The environment bundle (docs/environments.md): 'math' (self-refine), 'calc' (a calculator tool),
    module.path:Name or path/to/file.py:Name."""
    agent: str | None = None
    """An agent written against the OpenAI client instead of an env (docs/environments.md): path/to/file.py:fn or
    module.path:fn, fn(task, client) -> reward or {"reward": ..., ...}, sync or async. Each rollout worker serves
    it an OpenAI-compatible endpoint on 127.0.0.1; give --tasks. Not with --env."""
    agent_timeout_s: float = 300.0
    """An --agent episode still running this long after it started is ended as an env error (rollout/agent_timeouts)."""
    env_arg: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """The env's own options, key=value, one flag each (--env-arg a=1 --env-arg b=2); a config file may give a mapping."""
    reward: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """Reward functions, path/to/file.py:fn or module.path:fn, one flag each: TRL's fn(completions, **columns) ->
    list[float] or verl's compute_score(data_source, solution_str, ground_truth, extra_info). Without --env the run is
    single-turn (--env single) and they give the only reward; with one, see --reward-mode."""
    reward_weights: tuple[float, ...] = ()
    """One weight per --reward (empty: 1 each); an episode's reward from them is the weighted sum."""
    reward_mode: str = "add"
    """With an env: 'add' the functions' weighted sum to the env's reward, or 'replace' it."""
    tasks: str | None = None
    """Training tasks in the env's format: for math, a JSONL file (seed schema or GSM8K format) or an arith:...
    spec. None: the env's own default tasks (math: arith sums and differences 0-20); the run's config.json
    records the spec it resolved to."""
    eval_tasks: str | None = None
    """Held-out tasks, same formats ('': none). None: the env's own default held-out set. Any task that also
    appears in --tasks is removed from training."""
    task_fields: str | None = None
    """The task sources' own column names, key=column, comma-separated: question=problem,answer=solution,task_id=id
    (keys: question, answer, task_id). A source without a task_id column gets <source>-<row> ids."""
    limit: int | None = None
    """Use only the first N training tasks."""
    eval_limit: int | None = None
    """Use only the first N held-out tasks."""
    eval_set: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """More held-out sets, name=spec, one flag each (--eval-set gsm8k=../shared/data/gsm8k/test.jsonl): evaluated
    beside --eval-tasks (not removed from training), logged as eval/<name>/... and kept in eval.json."""
    eval_samples: int | None = None
    """Sampled episodes per held-out task at --eval-temperature, for pass@k and mean@n beside greedy success.
    None: greedy only."""
    eval_temperature: float = 0.7
    """Sampling temperature of the --eval-samples episodes."""
    eval_k: tuple[int, ...] = ()
    """The k of each pass@k (each <= --eval-samples). Empty: 1, the powers of two below n, and n."""
    max_prompt_tokens: int | None = None
    """Longest first prompt (chat template, system prompt, worked example, question) in tokens; a task over it is
    refused at start, naming it. None: the model's context less the room the turns need (responses, feedback)."""
    drop_long_prompts: bool = False
    """Leave tasks whose prompt is over the limit out (counted, the first named) instead of refusing the run."""
    # --- episodes ---
    max_turns: int = 2
    """Self-refine turns per episode: a wrong answer gets retry feedback until this many turns."""
    max_new_tokens: int = 32
    """Longest response per turn; a response cut here ends its episode as 'truncated'."""
    temperature: float = 0.7
    """Sampling temperature for training rollouts (evaluation is greedy)."""
    top_p: float = 1.0
    """Nucleus sampling mass; training needs 1.0 (the learner scores the full distribution), eval may truncate."""
    system_prompt: str | None = None
    """System prompt; None uses the built-in one."""
    worked_example: bool = True
    """Put one worked question/answer pair before the question (teaches the \\boxed{} format)."""
    grader_timeout_s: float = 5.0
    """CPU-time limit (seconds, not wall-clock) for one symbolic answer check; numeric answers need none."""
    # --- GRPO ---
    max_steps: int = 24
    """Learner updates."""
    tasks_per_step: int = 8
    """Groups (distinct tasks) per update."""
    num_samples_per_task: int = 4
    """Episodes per task: the GRPO group size."""
    lr: float = 6e-6
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""
    clip_low: float = 0.2
    """PPO clip: ratio floor is 1 - clip_low."""
    clip_high: float = 0.28
    """PPO clip: ratio ceiling is 1 + clip_high."""
    loss_agg: Literal["token-mean", "seq-mean", "seq-mean-token-sum-norm"] = "token-mean"
    """token-mean: the step's response tokens weigh the same; seq-mean: each sample's token mean weighs the same;
    seq-mean-token-sum-norm (Dr. GRPO): each sample's token sum / max_new_tokens, a constant, averaged over samples."""
    kl_coef: float = 0.0
    """KL-to-reference coefficient; > 0 loads a frozen copy of the initial model."""
    adv_estimator: Literal[tuple(ESTIMATORS)] = "grpo"
    """grpo: reward - group mean [/ group std]; rloo: reward - the mean of the group's other episodes;
    reinforce++: reward - group mean, then whitened by the mean and std over the whole step's response tokens
    (REINFORCE++-baseline as verl and OpenRLHF compute it). algos/advantages.py: the choices are its registry's
    names. adv_normalize_std applies to grpo only."""
    adv_normalize_std: bool = True
    """grpo: divide group-centred rewards by the group std (+ adv_eps); false with seq-mean-token-sum-norm is Dr. GRPO."""
    adv_std: Literal["population", "unbiased"] = "population"
    """The std an advantage is divided by (grpo's group std, reinforce++'s over the step's tokens): population
    (variance / n; OpenRLHF's reinforce_baseline) or unbiased (/ (n - 1); verl's and TRL's). docs/algorithms.md."""
    adv_eps: float = 1e-6
    """Epsilon added to the std an advantage is divided by."""
    drop_zero_std_groups: bool = True
    """Skip groups whose samples all got advantage 0 (episode credit: every episode the same reward); counted."""
    turn_credit: Literal["episode", "turn"] = "episode"
    """'episode': every turn gets the episode's group-relative advantage; 'turn': a turn's own reward plus
    turn_gamma x the next turn's return, normalised among the group's turns with the same index."""
    turn_gamma: float = 0.5
    """Discount of later turns' outcome under turn_credit='turn'; < 1 so a wrong first answer that a retry
    fixed scores below a first-try success (1.0 would give both the same first-turn return)."""
    off_policy_correction: Literal["none", "tis", "mis", "decoupled"] = "none"
    """'none' (PPO ratio to the sampler's logprobs), 'tis', 'mis' or 'decoupled' (see trainer/loss.py).
    'none' is the default: the learning benchmark (docs/learning.md) found no correction that helps here."""
    is_cap: float = 2.0
    """tis / decoupled: importance weight pi_learner / pi_sampler capped at this."""
    is_band: tuple[float, float] = (0.5, 2.0)
    """mis: tokens whose importance weight leaves [a, b] are masked (no gradient)."""
    dual_clip: float = 0.0
    """For negative advantages bound the PPO term by -A x this (3 is usual; 0: off)."""
    ratio_level: Literal["token", "sequence"] = "token"
    """token: PPO ratio per token; sequence (GSPO): one ratio per response (turn), the geometric mean of its token
    ratios, clipped with gspo_clip_low / gspo_clip_high; needs loss_agg seq-mean and no off_policy_correction."""
    gspo_clip_low: float = 3e-4
    """ratio_level=sequence: ratio floor is 1 - this (the GSPO paper's 3e-4)."""
    gspo_clip_high: float = 4e-4
    """ratio_level=sequence: ratio ceiling is 1 + this (the GSPO paper's 4e-4)."""
    entropy_coef: float = 0.0
    """Subtract this x the mean token entropy from the loss (from the training forward's logits; 0: off)."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning rate over the run's steps after warmup: constant, linear decay to 0 or cosine decay to 0
    at max_steps (a function of the step, so a resume continues it exactly)."""
    warmup_steps: int = 0
    """Steps of linear warmup from lr / (warmup_steps + 1) to lr, before lr_schedule applies."""
    updates_per_batch: int = 1
    """Optimizer steps per rollout batch: its groups split into this many mini-batches (by task-stream position
    mod this), one step each. A step (max_steps, checkpoints, published weights, lr_schedule) is still one
    rollout batch."""
    epochs: int = 1
    """Passes over each rollout batch (each pass makes updates_per_batch optimizer steps)."""
    micro_batch_tokens: int | None = None
    """Padded tokens per forward/backward micro-batch (bounds memory). None: 4096 on CPU; on CUDA what fits in
    the free memory by the model's size (trainer/micro_batches.py)."""
    max_pad_frac: float | None = None
    """Padding share of a step's micro-batches (perf/pad_frac) above which rows are bucketed by length into more
    micro-batches; 1: never. None: 0.2 on CUDA, never on CPU (regrouping moves float sums, and the seed's result)."""
    max_batch_episodes: int = 256
    """Most rows in one running decode batch (a whole 200-task eval fits; KV memory grows with it)."""
    cuda_graphs: bool = True
    """On a GPU, replay the decode step from CUDA graphs captured per batch-size bucket (no effect on CPU)."""
    dtype: Literal["float32", "bfloat16", "fp32", "bf16"] = "float32"
    """'float32' or 'bfloat16' (aliases fp32, bf16): bf16 computes in bf16 over fp32 master weights and
    optimizer state; workers sample with bf16 replicas and the weight broadcast moves bf16."""
    tf32: bool = True
    """On CUDA the update's fp32 matmuls run on TF32 tensor cores (trainer/precision.py); sampling stays fp32.
    Means nothing on CPU."""
    # --- LoRA (policy/lora.py, docs/lora.md) ---
    lora_rank: int = 0
    """LoRA adapter rank; 0: full fine-tune. > 0: the base is frozen in --dtype and held once, only the fp32
    adapters train, reach AdamW, are broadcast to the workers and checkpointed."""
    lora_alpha: float | None = None
    """LoRA scale numerator (the adapter's output is scaled by alpha / rank). None: 2 x rank, a scale of 2."""
    lora_dropout: float = 0.0
    """Dropout on the adapters' input; it acts only with --no-disable-dropout (the learner's forward otherwise
    runs in eval mode, like the sampler)."""
    lora_targets: str = "attn-mlp"
    """Layers that get adapters: 'attn-mlp' (every linear projection of the attention and MLP blocks), 'all-linear'
    (every linear layer but the head), or a comma list of module names (q_proj,v_proj)."""
    lora_merged: bool = True
    """With LoRA, final_model/ holds the adapter (peft's format) and final_model/merged/ the adapter merged into the
    base (loadable by transformers alone); --no-lora-merged skips merged/."""
    # --- sampler / learner agreement ---
    disable_dropout: bool = True
    """Run the learner's forward without dropout (eval mode), like the sampler, so fresh samples have ratio 1."""
    mask_truncated: bool = False
    """DAPO overlong filtering: episodes cut at max_new_tokens contribute no gradient (counted)."""
    fill_batch: bool = False
    """DAPO dynamic sampling: a step trains on tasks_per_step groups whose rewards differ, drawing more tasks
    (in rounds, as many as are missing) until it has them or has drawn fill_batch_cap x tasks_per_step; then it
    trains on what it has (rollout/fill_rate). Serial, or the pipeline with max_policy_lag 0."""
    fill_batch_cap: float = 3.0
    """fill_batch: most tasks one step draws, as a multiple of tasks_per_step (>= 1)."""
    overlong_buffer: int = 0
    """DAPO soft overlong punishment: a response longer than max_new_tokens - this loses up to overlong_penalty,
    linearly over the buffer's tokens, from its episode's reward before advantages (0: off)."""
    overlong_penalty: float = 1.0
    """The most an overlong response loses (overlong_buffer > 0)."""
    grad_checkpointing: bool = False
    """Activation checkpointing (transformers' own, non-reentrant): each decoder layer keeps only its input for the
    backward and is recomputed there: less learner memory for more compute; turns the shared-prompt-prefix forward off."""
    memory_plan_only: bool = False
    """Print the run's memory plan (nanorllm/memory/plan.py, docs/memory.md) and exit 0 without loading anything."""
    # --- processes and devices ---
    serial: bool = False
    """Run rollout and learning in this one process (the debug path)."""
    num_workers: int = 1
    """Rollout worker processes (pipeline mode)."""
    max_policy_lag: int = 1
    """Drop samples generated by weights more than this many versions behind the learner."""
    devices: str = "auto"
    """'auto', 'cpu', or a list like 'cuda:0,cuda:1': the first is the learner's, the rest the workers'."""
    learner_devices: str | None = None
    """Learner ranks (data-parallel, ranks/group.py): a count ('2': the first 2 devices of --devices) or a list
    ('cuda:0,cuda:1'); workers share the devices left. None: one rank on the first device (under torchrun, one per
    process torchrun starts on the node)."""
    learner_parallel: Literal["ddp", "fsdp"] = "ddp"
    """How the learner ranks split the model: 'ddp' (each holds the whole model, its gradients and its optimizer
    state) or 'fsdp' (each holds 1/N of them, ranks/fsdp.py: for a model whose optimizer state does not fit one
    device; rank 0 still holds the full weights). fsdp needs more than one learner rank."""
    learner_timeout_s: float = 1800.0
    """Longest a learner rank waits for the others in one collective (a hung rank stops the run after this): more than
    the longest held-out eval or wait for rollouts, which the other ranks spend waiting for rank 0. Until the first
    step's batch is shared (ranks and workers have started) the limit is --worker-start-timeout-s, if longer.
    inf: no limit."""
    threads: int | None = None
    """Torch threads per process on CPU; None splits the cores across processes."""
    queue_size: int = 4
    """Most finished episode batches a worker holds while the learner has not taken them (then it waits)."""
    # --- run folder, logging, checkpoints ---
    output_dir: str = "runs"
    """Where run folders go."""
    run_name: str | None = None
    """Run folder name; None makes <tasks>__<exp>__<seed>__<timestamp>."""
    report_to: str = "tensorboard"
    """Where scalars go, a comma list: tensorboard, jsonl (runs/<run>/metrics.jsonl, one object per step), wandb
    (pip install -e .[wandb]; WANDB_MODE=offline needs no network)."""
    exp_name: str = "grpo"
    """Experiment name used in the run folder name."""
    seed: int = 0
    """Seed for task order, sampling and initialisation."""
    resume_new_data: bool = False
    """With --resume: accept a task order that differs from the checkpoint's (another task file, seed, limit or
    held-out set); it starts at a new epoch. Never saved: each resume decides."""
    eval_every: int = 0
    """Evaluate held-out tasks every N steps (0: only before and after training)."""
    sample_every: int = 10
    """Log a few whole trajectories as text every N steps."""
    save_every: int = 0
    """Checkpoint every N steps (0: only at the end)."""
    keep_checkpoints: int = 3
    """Checkpoints kept on disk."""
    rollout_dump_size: int = 512
    """Most recent episodes kept in runs/<run>/rollouts.jsonl."""
    save_model: bool = True
    """Save the final model in HF format under runs/<run>/final_model."""
    # --- faults ---
    save_every_minutes: float = 10.0
    """Also checkpoint when this many minutes passed since the last one (0: off): a hard kill loses at most that."""
    worker_timeout_s: float | None = None
    """A worker with no progress this long is hung: killed, restarted, its jobs re-issued. None: max(60, 5 x the
    longest job); also the limit for held-out eval and --serial rollouts without progress (None: 600 s). inf: no
    limit."""
    worker_start_timeout_s: float = 600.0
    """Longest a worker (or a learner rank) may take to load its model and say it is ready. inf: no limit."""
    restart_backoff_s: float = 1.0
    """Wait before restarting a failed worker; doubles with each failure in a row (at most 60 s)."""
    max_restarts_per_worker: int = 5
    """A worker that fails this many times in a row without finishing a job stops the run."""
    max_restarts_per_run: int = 50
    """Worker restarts allowed in the whole run before it stops."""
    max_skipped_frac: float = 0.5
    """Share of updates that may train nothing (a non-finite loss or gradient, or a step whose every episode was an
    env error) before the run stops as failed (exit 1) instead of done; a run that trained nothing at all always
    fails."""

    def __post_init__(self):
        self.is_band = tuple(self.is_band)  # a JSON/YAML file or a saved config gives a list
        if isinstance(self.env_arg, dict):  # a config file's mapping
            self.env_arg = tuple(f"{k}={v}" for k, v in self.env_arg.items())
        self.env_arg = tuple(self.env_arg)
        self.eval_set, self.eval_k = tuple(self.eval_set), tuple(self.eval_k)
        self.reward, self.reward_weights = tuple(self.reward), tuple(self.reward_weights)

    def validate(self) -> list[str]:
        """Every problem, one line each, naming the field."""
        non_finite = self._non_finite()
        p = []
        positive = ["max_turns", "max_new_tokens", "max_steps", "tasks_per_step", "num_samples_per_task",
                    "micro_batch_tokens", "max_batch_episodes", "num_workers", "queue_size", "keep_checkpoints",
                    "grader_timeout_s", "rollout_dump_size"]
        for name in positive:
            if getattr(self, name) is not None and getattr(self, name) < 1:  # micro_batch_tokens None: sized at run time
                p.append(f"{name}: must be >= 1, got {getattr(self, name)}")
        for name in ["eval_every", "sample_every", "save_every", "max_policy_lag", "kl_coef", "weight_decay",
                     "save_every_minutes", "restart_backoff_s", "max_restarts_per_worker", "max_restarts_per_run"]:
            if getattr(self, name) < 0:
                p.append(f"{name}: must be >= 0, got {getattr(self, name)}")
        for name in ["limit", "eval_limit", "threads", "max_prompt_tokens"]:
            if getattr(self, name) is not None and getattr(self, name) < 1:
                p.append(f"{name}: must be >= 1 or unset, got {getattr(self, name)}")
        for name in ["worker_timeout_s", "worker_start_timeout_s", "learner_timeout_s"]:
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                p.append(f"{name}: must be > 0, got {getattr(self, name)}")
        if not 0 <= self.max_skipped_frac <= 1:
            p.append(f"max_skipped_frac: must be in [0, 1], got {self.max_skipped_frac}")
        p += self._lora_problems()
        if self.max_pad_frac is not None and not 0 <= self.max_pad_frac <= 1:
            p.append(f"max_pad_frac: must be in [0, 1] or unset, got {self.max_pad_frac}")
        if not self.lr > 0:
            p.append(f"lr: must be > 0, got {self.lr}")
        if not self.temperature > 0:
            p.append(f"temperature: must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            p.append(f"top_p: must be in (0, 1], got {self.top_p}")
        if not 0 <= self.clip_low < 1:
            p.append(f"clip_low: must be in [0, 1), got {self.clip_low}")
        if self.clip_high < 0:
            p.append(f"clip_high: must be >= 0, got {self.clip_high}")
        if not self.max_grad_norm > 0:
            p.append(f"max_grad_norm: must be > 0, got {self.max_grad_norm}")
        if self.turn_credit not in ("episode", "turn"):
            p.append(f"turn_credit: must be 'episode' or 'turn', got {self.turn_credit!r}")
        if not 0 <= self.turn_gamma <= 1:
            p.append(f"turn_gamma: must be in [0, 1], got {self.turn_gamma}")
        if self.off_policy_correction not in ("none", "tis", "mis", "decoupled"):
            p.append(f"off_policy_correction: must be one of none, tis, mis, decoupled, got {self.off_policy_correction!r}")
        if not self.is_cap > 0:
            p.append(f"is_cap: must be > 0, got {self.is_cap}")
        if len(self.is_band) != 2 or not 0 <= self.is_band[0] < self.is_band[1]:
            p.append(f"is_band: must be two numbers 0 <= a < b, got {self.is_band}")
        if self.dual_clip != 0 and not self.dual_clip > 1:
            p.append(f"dual_clip: must be 0 (off) or > 1, got {self.dual_clip}")
        if self.learner_parallel not in ("ddp", "fsdp"):
            p.append(f"learner_parallel: must be 'ddp' or 'fsdp', got {self.learner_parallel!r}")
        if self.loss_agg not in ("token-mean", "seq-mean", "seq-mean-token-sum-norm"):
            p.append(f"loss_agg: must be one of token-mean, seq-mean, seq-mean-token-sum-norm, got {self.loss_agg!r}")
        p += self._algorithm_problems()
        if self.dtype not in ("float32", "bfloat16", "fp32", "bf16"):
            p.append(f"dtype: must be 'float32' or 'bfloat16' (or fp32 / bf16), got {self.dtype!r}")
        if 0 < self.top_p < 1:
            p.append(f"top_p: training rollouts must sample the full distribution the learner scores (1.0), "
                     f"got {self.top_p}; truncated sampling is for evaluation only (SamplingParams.top_p)")
        if self.model.startswith("gemini:"):
            p.append(f"model: {self.model!r} is an API model with no logprobs or weights; it can be "
                     "evaluated (launch/eval.py) but not trained")
        if self.num_samples_per_task < 2:
            p.append("num_samples_per_task: GRPO needs >= 2 episodes per task to compare, "
                     f"got {self.num_samples_per_task}")
        if self.tasks == "":
            p.append("tasks: empty")
        p += eval_problems(self)
        from nanorllm.datasets.golds import TaskFieldsError, parse_task_fields

        try:
            parse_task_fields(self.task_fields)
        except TaskFieldsError as e:
            p.append(f"task_fields: {e}")
        if self.run_name is not None:
            parts = self.run_name.replace("\\", "/").split("/")
            if Path(self.run_name).is_absolute() or ".." in parts or all(x in ("", ".") for x in parts):
                p.append(f"run_name: must be one or more plain folder names under --output-dir (no '..', not "
                         f"absolute), got {self.run_name!r}")
        if (why := unwritable_dir(self.output_dir)) is not None:
            p.append(f"output_dir: {self.output_dir!r} {why}")
        if self.agent is not None and self.env != "math":
            p.append(f"agent: --agent replaces --env (the agent function is the episode); got --env {self.env!r} too")
        if self.agent_timeout_s <= 0:
            p.append(f"agent_timeout_s: must be > 0, got {self.agent_timeout_s}")
        from nanorllm.envs.registry import EnvSpecError, env_from_config

        p += self._reward_problems()
        from nanorllm.utils.sinks import parse_report_to

        try:
            if "wandb" in parse_report_to(self.report_to) and importlib.util.find_spec("wandb") is None:
                p.append("report_to: wandb is not installed (pip install -e .[wandb], or pip install wandb)")
        except ValueError as e:
            p.append(f"report_to: {e}")
        try:
            env = env_from_config(self, rewards=False)  # imports the env's module: a bad spec stops here
        except EnvSpecError as e:
            p.append(f"{'agent' if self.agent else 'env'}: {e}")
        else:
            if self.agent and self.tasks is None:
                p.append("tasks: an --agent run has no default tasks; give --tasks (e.g. calc:count=2000,seed=1)")
            elif self.tasks is None and not env.default_tasks:
                p.append(f"tasks: the env {self.env!r} has no default tasks (EnvBundle.default_tasks); give --tasks")
        return non_finite + [m for m in p if m.split(":")[0] not in {n.split(":")[0] for n in non_finite}]

    def _lora_problems(self) -> list[str]:
        p = []
        if self.lora_rank < 0:
            p.append(f"lora_rank: must be >= 0 (0: full fine-tune), got {self.lora_rank}")
        if self.lora_alpha is not None and not self.lora_alpha > 0:
            p.append(f"lora_alpha: must be > 0 or unset (2 x rank), got {self.lora_alpha}")
        if not 0 <= self.lora_dropout < 1:
            p.append(f"lora_dropout: must be in [0, 1), got {self.lora_dropout}")
        if not self.lora_targets.strip(" ,"):
            p.append("lora_targets: empty; 'attn-mlp', 'all-linear' or a comma list of module names")
        if self.lora_rank > 0 and self.learner_parallel == "fsdp":
            p.append("learner_parallel: 'fsdp' is not supported with LoRA (--lora-rank > 0); use 'ddp': each rank then "
                     "holds the frozen base once in --dtype and only the adapters' gradients and optimizer state")
        return p

    def _algorithm_problems(self) -> list[str]:
        """The GRPO variants' own ranges and the combinations that contradict each other, with the reason."""
        p = []
        hints = get_type_hints(TrainConfig)
        for name in ("adv_estimator", "adv_std", "ratio_level", "lr_schedule"):
            if getattr(self, name) not in (choices := get_args(hints[name])):
                p.append(f"{name}: must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        for name in ("updates_per_batch", "epochs"):
            if getattr(self, name) < 1:
                p.append(f"{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "overlong_buffer", "entropy_coef", "overlong_penalty"):
            if getattr(self, name) < 0:
                p.append(f"{name}: must be >= 0, got {getattr(self, name)}")
        for name in ("gspo_clip_low", "gspo_clip_high"):
            if not 0 < getattr(self, name) < 1:
                p.append(f"{name}: must be in (0, 1), got {getattr(self, name)}")
        if self.updates_per_batch > self.tasks_per_step >= 1:
            p.append(f"updates_per_batch: {self.updates_per_batch} mini-batches need at least as many groups, but "
                     f"tasks_per_step is {self.tasks_per_step}")
        if self.adv_estimator == "reinforce++" and self.turn_credit == "turn":
            p.append("adv_estimator: reinforce++ normalises over the whole step's episodes, but turn_credit 'turn' "
                     "compares a group's turns of one index (returns of first and later turns differ in scale); "
                     "use grpo or rloo with it")
        if self.ratio_level == "sequence":
            if self.off_policy_correction != "none":
                p.append(f"ratio_level: sequence (GSPO) is itself the importance ratio to the sampler per response; "
                         f"off_policy_correction {self.off_policy_correction!r} weighs tokens by theirs on top: use none")
            if self.loss_agg != "seq-mean":
                p.append(f"ratio_level: sequence (GSPO) averages each response's tokens, then the responses (the "
                         f"paper's objective): needs loss_agg seq-mean, got {self.loss_agg!r}")
        if self.overlong_buffer:
            if self.overlong_buffer > self.max_new_tokens:
                p.append(f"overlong_buffer: {self.overlong_buffer} is more than max_new_tokens ({self.max_new_tokens})")
            if self.turn_credit == "turn":
                p.append("overlong_buffer: the overlong penalty shapes the episode's reward; turn_credit 'turn' scores "
                         "turns by the env's per-turn rewards: use turn_credit episode")
        if self.fill_batch:
            if not self.drop_zero_std_groups:
                p.append("fill_batch: it replaces groups whose rewards are all the same, so they must not train: "
                         "drop_zero_std_groups must be true")
            if not self.serial and self.max_policy_lag != 0:
                p.append(f"fill_batch: with max_policy_lag {self.max_policy_lag} the pipeline has drawn later steps' "
                         "tasks before a step's extra ones, which would break the task stream's exactly-once order: "
                         "use --max-policy-lag 0 (or --serial)")
            if not self.fill_batch_cap >= 1:
                p.append(f"fill_batch_cap: must be >= 1, got {self.fill_batch_cap}")
        if self.warmup_steps >= self.max_steps >= 1 and self.warmup_steps:
            p.append(f"warmup_steps: {self.warmup_steps} is not below max_steps ({self.max_steps}): the run never "
                     "reaches --lr")
        return p

    def _reward_problems(self) -> list[str]:
        p = []
        if self.reward_mode not in ("add", "replace"):
            p.append(f"reward_mode: must be 'add' or 'replace', got {self.reward_mode!r}")
        if self.reward_weights and len(self.reward_weights) != len(self.reward):
            p.append(f"reward_weights: {len(self.reward_weights)} weight(s) for {len(self.reward)} --reward function(s)")
        if self.reward and self.agent:
            p.append("reward: --reward functions score an --env's episodes; an --agent function returns its own reward")
        from nanorllm.envs.modules import EnvSpecError
        from nanorllm.envs.reward_fns import load_reward_function

        for spec in self.reward:
            try:
                load_reward_function(spec)  # imports the file: a bad spec or signature stops here
            except EnvSpecError as e:
                p.append(f"reward: {e}")
        return p

    def _non_finite(self) -> list[str]:
        """nan anywhere, inf anywhere but in the fields where it means 'no limit'."""
        p = []
        for f in fields(self):
            values = getattr(self, f.name)
            for v in values if isinstance(values, tuple) else [values]:
                if isinstance(v, float) and not math.isfinite(v) and not (f.name in NO_LIMIT_FIELDS and v == math.inf):
                    hint = f" (inf means 'no limit' only for {', '.join(NO_LIMIT_FIELDS)})" if v == math.inf else ""
                    p.append(f"{f.name}: must be a finite number, got {v}{hint}")
        return p

    def saved(self) -> dict:
        """The fields as written beside the run and into checkpoints (a one-resume decision left out)."""
        return {**asdict(self), "resume_new_data": False}


@dataclass
class ConfigFile:
    """A --config file read field by field: typed values, what is wrong with it, and each key's line."""

    path: str
    values: dict
    problems: list[str]
    lines: dict[str, int]

    def where(self, name: str) -> str:
        return f"{self.path}:{self.lines[name]}" if name in self.lines else self.path


def load_config_file(path: str) -> ConfigFile:
    """Read a JSON or YAML mapping of TrainConfig fields, each value converted by its field's type as a flag's
    would be (`lr: 1e-5`, which YAML reads as text, is the float 1e-5). Every wrong type, unknown key and
    repeated key is a problem naming the field, the file and the line; the good values are kept, so the
    caller can report them beside the other problems. A file that cannot be read or parsed raises
    ConfigError at once."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([f"--config {path}: cannot read it ({type(e).__name__}: {e})"], path) from None
    import yaml

    try:
        data = yaml.safe_load(text) if path.endswith((".yaml", ".yml")) else json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError([f"{path}:{e.lineno}: invalid JSON: {e.msg}"], path) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{path}:{mark.line + 1}" if mark is not None else path
        raise ConfigError([f"{at}: invalid YAML: {getattr(e, 'problem', None) or e}"], path) from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: expected a mapping of fields, got {type(data).__name__}"], path)
    out = ConfigFile(path, {}, [], {})
    repeated = []
    try:  # YAML is a superset of JSON: its nodes carry each key's line for either format
        for key, _ in yaml.compose(text).value:
            if key.value in out.lines:
                repeated.append(f"{key.value}: given twice (lines {out.lines[key.value]} and "
                                f"{key.start_mark.line + 1})")
            out.lines.setdefault(str(key.value), key.start_mark.line + 1)
    except (yaml.YAMLError, AttributeError):  # JSON that PyYAML's YAML 1.1 reads differently: no line numbers
        pass
    hints = get_type_hints(TrainConfig)
    for key, value in data.items():
        name = str(key)
        if name not in hints:
            close = difflib.get_close_matches(name, list(hints), n=1, cutoff=0.8)
            out.problems.append(f"{name}: unknown field{f' (did you mean {close[0]}?)' if close else ''} "
                                f"({out.where(name)})")
            continue
        try:
            out.values[name] = convert_field(value, hints[name])
        except ValueError as e:
            out.problems.append(f"{name}: {e} ({out.where(name)})")
    out.problems += [f"{r} in {path}" for r in repeated]
    return out


def unwritable_dir(path: str) -> str | None:
    """Why a run folder could not be made under `path` (None: it could), found without writing anything."""
    here = Path(path).absolute()
    while not here.exists():
        if here.is_symlink():
            return f"cannot be created: {here} is a broken link"
        here = here.parent
    if not here.is_dir():
        return f"cannot be created: {here} is not a folder"
    if not os.access(here, os.W_OK | os.X_OK):
        return f"cannot be created or written: {here} is not writable"
    return None


def read_config_file(path: str) -> dict:
    """A JSON or YAML mapping of TrainConfig fields, typed; any problem raises ConfigError listing them all."""
    f = load_config_file(path)
    if f.problems:
        raise ConfigError(f.problems, path)
    return f.values


def _got(value: object) -> str:
    return f"got {value!r} ({'null' if value is None else type(value).__name__})"


def convert_field(value: object, hint: object) -> object:
    """A config file's value as the field typed `hint` holds it, converted the way its flag's text would be
    (numbers may be written as text: "1e-5"); ValueError says what was expected and what came."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, UnionType):
        if type(None) in args and (value is None or value in ("None", "null")):
            return None
        (inner,) = [a for a in args if a is not type(None)]
        try:
            return convert_field(value, inner)
        except ValueError as e:
            raise ValueError(f"{e}; or null to leave it unset") from None
    if origin is Literal:
        if isinstance(value, str):
            return value  # off the choices: validate() names it beside the other problems
        raise ValueError(f"expected one of {', '.join(args)}, {_got(value)}")
    if origin is tuple:
        if args[-1] is Ellipsis and isinstance(value, dict):  # env_arg as a mapping of the env's options
            return tuple(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in value.items())
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"expected a list, {_got(value)}")
        types = [args[0]] * len(value) if args[-1] is Ellipsis else list(args)
        if len(types) != len(value):
            raise ValueError(f"expected a list of {len(types)}, {_got(value)}")
        return tuple(convert_field(v, t) for v, t in zip(value, types))
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError(f"expected true or false, {_got(value)}")
    if hint in (int, float):
        if isinstance(value, str):
            try:
                return hint(value.strip())
            except ValueError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            return hint(value)
        elif isinstance(value, float) and hint is float:
            return value
        raise ValueError(f"expected {'an integer' if hint is int else 'a number'}, {_got(value)}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ValueError(f"expected text, {_got(value)} (quote it to mean the text)")
    raise ValueError(f"cannot be set from a file ({hint})")


TRAIN_DESCRIPTION = ("Train a causal LM with GRPO on multi-turn episodes of an environment (--env; math self-refine "
                     "by default). Also: --config FILE (JSON/YAML defaults), --resume RUN_DIR (continue a run).")


def parse_config(argv: list[str] | None = None, *, base: TrainConfig | None = None,
                 description: str = TRAIN_DESCRIPTION) -> TrainConfig:
    """--config FILE first, then flags on top; validated before returning. Every problem of the file and of
    the flags is reported at once; one of a value the file set names the file and its line. `description`
    heads --help."""
    import argparse

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, rest = pre.parse_known_args(argv)
    resumed = base is not None  # a resumed run's saved config: its env stands
    base = base or TrainConfig()
    file = None
    if known.config:
        file = load_config_file(known.config)
        base = TrainConfig(**{**asdict(base), **file.values})
    env_flag = (file is not None and "env" in file.values) or any(a.split("=")[0] == "--env" for a in rest)
    base, rest, off_choice = _set_aside_off_choice(base, rest)
    cfg = tyro.cli(TrainConfig, default=base, args=rest, description=description)
    cfg = replace(cfg, **off_choice)
    if cfg.reward and cfg.env == DEFAULT_ENV_NAME and not (resumed or env_flag):
        cfg = replace(cfg, env="single")  # reward functions and no --env: one turn, scored by them alone
    problems = cfg.validate()
    if cfg.agent and env_flag and cfg.env == "math":  # validate() sees only an env other than the default
        problems.append("agent: --agent replaces --env (the agent function is the episode); got --env 'math' too")
    if file is not None:
        from_file = {n for n, v in file.values.items() if getattr(cfg, n) == v}  # not changed by a flag
        problems = file.problems + [f"{p} ({file.where(p.split(':')[0])})" if p.split(":")[0] in from_file else p
                                    for p in problems]
    if problems:
        raise ConfigError(problems, known.config or "command-line flags")
    return cfg


def _set_aside_off_choice(base: TrainConfig, argv: list[str]) -> tuple[TrainConfig, list[str], dict]:
    """Values of Literal fields outside their choices, taken out of the file's config and the flags.

    tyro would stop at the first such flag; set aside and put back after parsing, they reach validate(),
    which reports them beside every other problem, naming the field.
    """
    choices = {name: get_args(t) for name, t in get_type_hints(TrainConfig).items() if get_origin(t) is Literal}
    off = {name: getattr(base, name) for name in choices if getattr(base, name) not in choices[name]}
    base = replace(base, **{name: getattr(TrainConfig, name) for name in off})
    flags = {"--" + name.replace("_", "-"): name for name in choices}
    kept, i = [], 0
    while i < len(argv):
        flag, eq, value = argv[i].partition("=")
        name = flags.get(flag.replace("_", "-"))
        if name is None or (not eq and i + 1 == len(argv)):
            kept.append(argv[i])
            i += 1
            continue
        value, used = (value, 1) if eq else (argv[i + 1], 2)
        if value in choices[name]:
            off.pop(name, None)  # a valid flag overrides an off-choice value from the file
            kept.extend(argv[i:i + used])
        else:
            off[name] = value
        i += used
    return base, kept, off


def format_config(cfg: TrainConfig) -> str:
    """A two-column table, for the console and TensorBoard's text tab."""
    rows = [f"|{k}|{v}|" for k, v in asdict(cfg).items()]
    return "|param|value|\n|-|-|\n" + "\n".join(rows)
