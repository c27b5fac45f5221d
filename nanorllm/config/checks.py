"""What is wrong with a config on its own terms: ranges, choices, and settings that contradict each other.

Pure: nothing here imports a user's file, probes a service or looks at a folder (those checks need the world
and belong to the run's assembly, nanorllm/run/world.py). A choice list is read off its field's `Literal`
type (`literal_fields`), so each name is written once, in fields.py.
"""

import math
import re
from dataclasses import fields
from pathlib import Path
from typing import Literal, get_args, get_origin, get_type_hints

from nanorllm.algos.advantages import estimator_problem
from nanorllm.envs.registry import DEFAULT_ENV

# Limits where `inf` means "no limit" (documented on each field); every other number must be finite.
NO_LIMIT_FIELDS = ("worker_timeout_s", "worker_start_timeout_s", "learner_timeout_s")


def literal_fields(cls: type) -> dict[str, tuple]:
    """{name: choices} of every Literal field of `cls`."""
    return {name: get_args(t) for name, t in get_type_hints(cls).items() if get_origin(t) is Literal}


def choice_problem(name: str, value: object, allowed: tuple) -> list[str]:
    """`value` off `allowed`, in the words every choice field uses."""
    if value in allowed:
        return []
    listed = f"'{allowed[0]}' or '{allowed[1]}'" if len(allowed) == 2 else f"one of {', '.join(allowed)}"
    return [f"{name}: must be {listed}, got {value!r}"]


def bound_problems(cfg, rules: dict[str, str]) -> list[str]:
    """`name: must be RULE, got V` for each field of `rules` whose value breaks its rule, in the rules' order. A
    rule is '>= N' or '> N', then any words its message adds ('>= 1 or unset'); an unset (None) field breaks
    none."""
    p = []
    for name, rule in rules.items():
        value = getattr(cfg, name)
        op, bound = rule.split()[:2]
        if value is not None and not (value >= float(bound) if op == ">=" else value > float(bound)):
            p.append(f"{name}: must be {rule}, got {value}")
    return p


def agent_env_problems(cfg, *, env_given: bool = False) -> list[str]:
    """--agent and --env name the episode twice (`env_given`: --env was set, even to the default)."""
    if cfg.agent is not None and (cfg.env != DEFAULT_ENV or env_given):
        return [f"agent: --agent replaces --env (the agent function is the episode); got --env {cfg.env!r} too"]
    return []


def eval_problems(cfg) -> list[str]:
    """What is wrong with the evaluation fields (fields.EvalSettings) of a TrainConfig or an EvalConfig."""
    p = bound_problems(cfg, {"eval_samples": ">= 1 or unset (greedy only)"})
    if not p and cfg.eval_k and cfg.eval_samples is None:
        p.append(f"eval_k: {list(cfg.eval_k)} needs --eval-samples n >= its largest k")
    elif not p and cfg.eval_samples is not None:
        bad = [k for k in cfg.eval_k if not 1 <= k <= cfg.eval_samples]
        if bad:
            p.append(f"eval_k: each k must be in 1..{cfg.eval_samples} (--eval-samples), got {bad}")
    p += bound_problems(cfg, {"eval_temperature": "> 0"})
    names = []
    for item in cfg.eval_set:
        name, sep, spec = item.partition("=")
        if not sep or not spec or not re.fullmatch(r"[a-z0-9_]+", name):
            p.append(f"eval_set: {item!r} is not name=spec with a name of a-z, 0-9 and _")
        elif name in names:
            p.append(f"eval_set: name {name!r} is given twice")
        names.append(name)
    return p


def config_problems(cfg) -> list[str]:
    """Every problem of a TrainConfig, one line each, naming the field; a field that is not finite is named
    once, for that."""
    non_finite = _non_finite(cfg)
    p = []
    p += bound_problems(cfg, {  # micro_batch_tokens None: sized at run time
        **dict.fromkeys(["max_turns", "max_new_tokens", "max_steps", "tasks_per_step", "num_samples_per_task",
                         "micro_batch_tokens", "max_batch_episodes", "num_workers", "queue_size", "keep_checkpoints",
                         "grader_timeout_s", "rollout_dump_size", "pool_every", "pool_size"], ">= 1"),
        **dict.fromkeys(["eval_every", "sample_every", "save_every", "max_policy_lag", "kl_coef", "weight_decay",
                         "save_every_minutes", "restart_backoff_s", "max_restarts_per_worker",
                         "max_restarts_per_run"], ">= 0"),
        **dict.fromkeys(["limit", "eval_limit", "threads", "max_prompt_tokens"], ">= 1 or unset"),
        **dict.fromkeys(["worker_timeout_s", "worker_start_timeout_s", "learner_timeout_s"], "> 0")})
    if not 0 <= cfg.max_skipped_frac <= 1:
        p.append(f"max_skipped_frac: must be in [0, 1], got {cfg.max_skipped_frac}")
    p += _lora_problems(cfg)
    if cfg.max_pad_frac is not None and not 0 <= cfg.max_pad_frac <= 1:
        p.append(f"max_pad_frac: must be in [0, 1] or unset, got {cfg.max_pad_frac}")
    p += bound_problems(cfg, {"lr": "> 0", "temperature": "> 0"})
    if not 0 < cfg.top_p <= 1:
        p.append(f"top_p: must be in (0, 1], got {cfg.top_p}")
    if not 0 <= cfg.clip_low < 1:
        p.append(f"clip_low: must be in [0, 1), got {cfg.clip_low}")
    p += bound_problems(cfg, {"clip_high": ">= 0", "max_grad_norm": "> 0"})
    if not 0 <= cfg.turn_gamma <= 1:
        p.append(f"turn_gamma: must be in [0, 1], got {cfg.turn_gamma}")
    p += bound_problems(cfg, {"is_cap": "> 0"})
    if len(cfg.is_band) != 2 or not 0 <= cfg.is_band[0] < cfg.is_band[1]:
        p.append(f"is_band: must be two numbers 0 <= a < b, got {cfg.is_band}")
    if cfg.dual_clip != 0 and not cfg.dual_clip > 1:
        p.append(f"dual_clip: must be 0 (off) or > 1, got {cfg.dual_clip}")
    p += _choice_problems(cfg)
    p += _algorithm_problems(cfg)
    if 0 < cfg.top_p < 1:
        p.append(f"top_p: training rollouts must sample the full distribution the learner scores (1.0), "
                 f"got {cfg.top_p}; truncated sampling is for evaluation only (SamplingParams.top_p)")
    if cfg.model.startswith("gemini:"):
        p.append(f"model: {cfg.model!r} is an API model with no logprobs or weights; it can be "
                 "evaluated (launch/eval.py) but not trained")
    if cfg.num_samples_per_task < 2:
        p.append("num_samples_per_task: GRPO needs >= 2 episodes per task to compare, "
                 f"got {cfg.num_samples_per_task}")
    if cfg.tasks == "":
        p.append("tasks: empty")
    p += eval_problems(cfg)
    from nanorllm.datasets.golds import TaskFieldsError, parse_task_fields

    try:
        parse_task_fields(cfg.task_fields)
    except TaskFieldsError as e:
        p.append(f"task_fields: {e}")
    if cfg.run_name is not None:
        parts = cfg.run_name.replace("\\", "/").split("/")
        if Path(cfg.run_name).is_absolute() or ".." in parts or all(x in ("", ".") for x in parts):
            p.append(f"run_name: must be one or more plain folder names under --output-dir (no '..', not "
                     f"absolute), got {cfg.run_name!r}")
    if any(c in cfg.exp_name for c in "/\\\0"):
        p.append(f"exp_name: must be a plain name (it goes into the run folder's name under --output-dir: no "
                 f"'/' or '\\'), got {cfg.exp_name!r}")
    p += agent_env_problems(cfg)
    p += bound_problems(cfg, dict.fromkeys(["agent_timeout_s", "reward_timeout_s", "env_timeout_s"], "> 0"))
    p += _reward_problems(cfg) + judge_problems(cfg) + distill_problems(cfg)
    p += tool_problems(cfg)
    p += bound_problems(cfg, dict.fromkeys(["tool_alarm_steps", "collapse_alarm_steps"], ">= 0 (0: off)"))
    from nanorllm.utils.sinks import parse_report_to

    try:
        parse_report_to(cfg.report_to)
    except ValueError as e:
        p.append(f"report_to: {e}")
    named = {n.split(":")[0] for n in non_finite}
    return non_finite + [m for m in p if m.split(":")[0] not in named]


def _choice_problems(cfg) -> list[str]:
    """Each Literal field off its choices (dtype names its aliases)."""
    p = []
    for name, allowed in literal_fields(type(cfg)).items():
        if name == "dtype":
            if cfg.dtype not in allowed:
                p.append(f"dtype: must be 'auto', 'float32' or 'bfloat16' (or fp32 / bf16), got {cfg.dtype!r}")
            continue
        p += choice_problem(name, getattr(cfg, name), allowed)
    return p


def _lora_problems(cfg) -> list[str]:
    p = bound_problems(cfg, {"lora_rank": ">= 0 (0: full fine-tune)", "lora_alpha": "> 0 or unset (2 x rank)"})
    if not 0 <= cfg.lora_dropout < 1:
        p.append(f"lora_dropout: must be in [0, 1), got {cfg.lora_dropout}")
    if not cfg.lora_targets.strip(" ,"):
        p.append("lora_targets: empty; 'attn-mlp', 'all-linear' or a comma list of module names")
    if cfg.lora_rank > 0 and cfg.learner_parallel == "fsdp":
        p.append("learner_parallel: 'fsdp' is not supported with LoRA (--lora-rank > 0); use 'ddp': each rank then "
                 "holds the frozen base once in --dtype and only the adapters' gradients and optimizer state")
    return p


def _algorithm_problems(cfg) -> list[str]:
    """The GRPO variants' own ranges and the combinations that contradict each other, with the reason."""
    p = bound_problems(cfg, {"updates_per_batch": ">= 1", "epochs": ">= 1"})
    low = bound_problems(cfg, {"min_group_size": ">= 2 (one episode has nothing to compare with)"})
    p += low
    if not low and cfg.min_group_size > cfg.num_samples_per_task >= 2:  # a group too small is named on its own
        p.append(f"min_group_size: {cfg.min_group_size} is more than num_samples_per_task "
                 f"({cfg.num_samples_per_task}): every group with a failed episode would be dropped")
    p += bound_problems(cfg, dict.fromkeys(["warmup_steps", "overlong_buffer", "entropy_coef", "overlong_penalty"],
                                           ">= 0"))
    for name in ("gspo_clip_low", "gspo_clip_high"):
        if not 0 < getattr(cfg, name) < 1:
            p.append(f"{name}: must be in (0, 1), got {getattr(cfg, name)}")
    if cfg.updates_per_batch > cfg.tasks_per_step >= 1:
        p.append(f"updates_per_batch: {cfg.updates_per_batch} mini-batches need at least as many groups, but "
                 f"tasks_per_step is {cfg.tasks_per_step}")
    unknown = estimator_problem(cfg.adv_estimator)  # the registry's names at check time, a user's too
    if unknown:
        p.append(f"adv_estimator: {unknown}")
    if cfg.adv_estimator == "reinforce++" and cfg.turn_credit == "turn":
        p.append("adv_estimator: reinforce++ normalises over the whole step's episodes, but turn_credit 'turn' "
                 "compares a group's turns of one index (returns of first and later turns differ in scale); "
                 "use grpo or rloo with it")
    if not 0 <= cfg.rae_decay < 1:
        p.append(f"rae_decay: must be in [0, 1), got {cfg.rae_decay}")
    if cfg.adv_estimator == "rae" and (cfg.learner_devices or "1") != "1":
        p.append(f"adv_estimator: rae keeps its game-and-seat baselines on one learner rank; learner_devices "
                 f"{cfg.learner_devices!r} asks for several")
    if cfg.ratio_level == "sequence":
        if cfg.off_policy_correction != "none":
            p.append(f"ratio_level: sequence (GSPO) is itself the importance ratio to the sampler per response; "
                     f"off_policy_correction {cfg.off_policy_correction!r} weighs tokens by theirs on top: use none")
        if cfg.loss_agg != "seq-mean":
            p.append(f"ratio_level: sequence (GSPO) averages each response's tokens, then the responses (the "
                     f"paper's objective): needs loss_agg seq-mean, got {cfg.loss_agg!r}")
    if cfg.overlong_buffer:
        if cfg.overlong_buffer > cfg.max_new_tokens:
            p.append(f"overlong_buffer: {cfg.overlong_buffer} is more than max_new_tokens ({cfg.max_new_tokens})")
        if cfg.turn_credit == "turn":
            p.append("overlong_buffer: the overlong penalty shapes the episode's reward; turn_credit 'turn' scores "
                     "turns by the env's per-turn rewards: use turn_credit episode")
    if cfg.fill_batch:
        if not cfg.drop_zero_std_groups:
            p.append("fill_batch: it replaces groups whose rewards are all the same, so they must not train: "
                     "drop_zero_std_groups must be true")
        if not cfg.serial and cfg.max_policy_lag != 0:
            p.append(f"fill_batch: with max_policy_lag {cfg.max_policy_lag} the pipeline has drawn later steps' "
                     "tasks before a step's extra ones, which would break the task stream's exactly-once order: "
                     "use --max-policy-lag 0 (or --serial)")
        p += bound_problems(cfg, {"fill_batch_cap": ">= 1"})
    p += sampler_problems(cfg)
    if cfg.warmup_steps >= cfg.max_steps >= 1 and cfg.warmup_steps:
        p.append(f"warmup_steps: {cfg.warmup_steps} is not below max_steps ({cfg.max_steps}): the run never "
                 "reaches --lr")
    return p


def tool_problems(cfg) -> list[str]:
    """The --tools fields' own bounds (fields.ToolSettings, of a TrainConfig or an EvalConfig); that the tools'
    file imports and each function has a schema is the assembly's check."""
    p = []
    if cfg.tools is not None and not cfg.tools.strip():
        p.append("tools: empty; give path/to/tools.py:fn1,fn2 or leave it unset")
    if cfg.tools and cfg.agent:
        p.append("tools: --tools gives an --env's episodes tools; an --agent passes its own in each request")
    return p + bound_problems(cfg, {"max_tool_calls": ">= 1", "tool_timeout_s": "> 0"}) + call_limit_problems(cfg)


MAX_CALL_LIMIT_S = 86400.0  # a day: a wait longer than any run's step, and one the clock calls can take (1e300 is not)


def call_limit_problems(cfg) -> list[str]:
    """A user-code call's wall-clock limit past MAX_CALL_LIMIT_S: too large to wait on (every call would fail)."""
    return [f"{name}: must be at most {MAX_CALL_LIMIT_S:g} s (a day), got {getattr(cfg, name):g}"
            for name in ("tool_timeout_s", "reward_timeout_s") if getattr(cfg, name) > MAX_CALL_LIMIT_S]


def _reward_problems(cfg) -> list[str]:
    """The reward fields' own consistency; that each --reward file imports is the assembly's check."""
    p = []
    if cfg.reward_weights and len(cfg.reward_weights) != len(cfg.reward):
        p.append(f"reward_weights: {len(cfg.reward_weights)} weight(s) for {len(cfg.reward)} --reward function(s)")
    if cfg.reward and cfg.agent:
        p.append("reward: --reward functions score an --env's episodes; an --agent function returns its own reward")
    if cfg.reward_model is not None:
        if cfg.agent:
            p.append("reward_model: a reward model scores an --env's episodes; an --agent function returns its own "
                     "reward")
        p += bound_problems(cfg, {"reward_model_batch_size": ">= 1", "reward_model_max_tokens": ">= 1"})
        device = cfg.reward_model_device
        if device is not None and not re.fullmatch(r"cpu|cuda(:\d+)?", device):
            p.append(f"reward_model_device: must be cpu, cuda or cuda:N, got {device!r}")
    return p


def distill_problems(cfg) -> list[str]:
    """The distillation fields' own consistency; that the teacher shares the student's tokenizer is the world's check
    (run/world.py)."""
    p = bound_problems(cfg, {"distill_coef": ">= 0"})
    if cfg.teacher is None:
        if cfg.distill_only:
            p.append("distill_only: trains on a --teacher's signal alone, and no --teacher is given")
        return p
    if cfg.distill_coef == 0 and not p:
        p.append("distill_coef: 0 gives the --teacher no weight; leave --teacher out instead")
    device = cfg.teacher_device
    if device is not None and not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        p.append(f"teacher_device: must be cpu, cuda or cuda:N, got {device!r}")
    return p


def judge_problems(cfg) -> list[str]:
    """The judge fields (fields.JudgeSettings) of a TrainConfig or an EvalConfig; that the rubric file reads is the
    judge's own start-up check (rewards/judge.py judge_world_problems, run by run/world.py)."""
    if not cfg.judge:
        return []
    p = []
    if not (re.match(r"https?://[^/\s]+", cfg.judge) or re.fullmatch(r"gemini:\S+", cfg.judge)):
        p.append(f"judge: expected an OpenAI-compatible base URL (http://host:port/v1) or gemini:<model>, "
                 f"got {cfg.judge!r}")
    p += bound_problems(cfg, {"judge_concurrency": ">= 1", "judge_retries": ">= 0", "judge_timeout_s": "> 0",
                              "judge_max_tokens": ">= 1"})
    if getattr(cfg, "agent", None):
        p.append("judge: the judge scores an --env's episodes; an --agent function returns its own reward")
    return p


def _non_finite(cfg) -> list[str]:
    """nan anywhere, inf anywhere but in the fields where it means 'no limit'."""
    p = []
    for f in fields(cfg):
        values = getattr(cfg, f.name)
        for v in values if isinstance(values, tuple) else [values]:
            if isinstance(v, float) and not math.isfinite(v) and not (f.name in NO_LIMIT_FIELDS and v == math.inf):
                hint = f" (inf means 'no limit' only for {', '.join(NO_LIMIT_FIELDS)})" if v == math.inf else ""
                p.append(f"{f.name}: must be a finite number, got {v}{hint}")
    return p


def sampler_problems(cfg) -> list[str]:
    """The signal sampler's band and shares (fields.TaskSampling)."""
    p = []
    if len(cfg.sampler_band) != 2 or not 0 <= cfg.sampler_band[0] < cfg.sampler_band[1] <= 1:
        p.append(f"sampler_band: must be two pass rates 0 <= low < high <= 1, got {cfg.sampler_band}")
    if not 0 <= cfg.sampler_explore <= 1:
        p.append(f"sampler_explore: must be a chance in [0, 1], got {cfg.sampler_explore}")
    if not 0 <= cfg.sampler_revisit <= 1:
        p.append(f"sampler_revisit: must be a chance in [0, 1], got {cfg.sampler_revisit}")
    return p
