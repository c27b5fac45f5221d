"""A learned reward model as a reward source (--reward-model PATH): a local HF sequence classifier that scores
each episode's (prompt, response).

The prompt is the task's question (or, for a conversational task, its messages), the response the episode's last
one, rendered with the reward model's *own* tokenizer's chat template (user = prompt, assistant = response; plain
"prompt\\n\\nresponse" when it has none), cut to --reward-model-max-tokens from the left (the prompt's start goes
first), and scored in batches of --reward-model-batch-size. A 1-label head's logit is the score; a 2-label head's
score is logit[1] - logit[0] (the log-odds of label 1; P(label 1) is its sigmoid). The raw score is normalised
(--reward-model-norm, rewards/norm.py) before it joins the reward, and logged raw (reward/model_mean, _std).

It is loaded lazily, once per process that scores (in the pipeline every rollout worker holds its own copy, and
the learner one when it scores held-out episodes), never with the folder's own code (trust_remote_code=False),
frozen (eval(), no gradients), on --reward-model-device or else the device of the process's policy. A score that
is not finite is a failed score (nan), never a 0 (rewards/functions.py).

At start the folder is loaded once and scores one example (reward_model_problems), so what does not fit is
refused in one line before anything trains, instead of failing every scoring call: a head its weights lack (a
causal LM's weights under a sequence-classification config would score with a random head) or whose shape they
do not match, a tokenizer with more tokens than the model has embeddings, a score that is not finite.
"""

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Literal

from nanorllm.core.types import RolloutResult
from nanorllm.rewards.norm import RunningNorm, mean_std, normalise
from nanorllm.rewards.sources import HeldModel, register_reward_source

SEQUENCE_CLASSIFIER = "ForSequenceClassification"


@dataclass
class RewardModelSettings:
    """A reward model as a reward source (docs/rewards.md)."""

    reward_model: str | None = None
    """A local HF sequence-classifier folder (num_labels 1: the score; 2: logit[1] - logit[0]) that scores each
    episode's (prompt, last response) as a reward source beside the --reward functions (docs/rewards.md); fit one
    with launch/train_reward_model.py. Loaded once in each process that scores (every rollout worker), frozen."""
    reward_model_weight: float = 1.0
    """The --reward-model score's weight in the reward (added to, or with --reward-mode replace instead of, the env's)."""
    reward_model_norm: Literal["none", "group", "running"] = "none"
    """none: the raw score; group: z-scored within the episode's group; running: z-scored by a running mean/std of
    every score so far in the scoring process (per process, not checkpointed)."""
    reward_model_batch_size: int = 8
    """(prompt, response) pairs per --reward-model forward."""
    reward_model_dtype: Literal["float32", "bfloat16"] = "float32"
    """The --reward-model's weights and compute dtype."""
    reward_model_device: str | None = None
    """Where the --reward-model runs (cpu, cuda, cuda:N). None: the device of the process that scores (a rollout
    worker's, or --serial's learner's)."""
    reward_model_max_tokens: int = 1024
    """Longest rendered (prompt, response) the --reward-model reads; a longer one loses its first tokens."""


@dataclass(frozen=True)
class RewardModelSpec:
    """A --reward-model and how it scores, as data (a reward source's spec, rewards/sources.py); `RewardModel`
    takes these fields."""

    path: str
    weight: float = 1.0
    norm: str = "none"
    batch_size: int = 8
    dtype: str = "float32"
    device: str | None = None  # None: the scoring process's policy device
    max_tokens: int = 1024


def reward_model_spec(settings: RewardModelSettings) -> RewardModelSpec | None:
    """The --reward-model and its settings; None without one."""
    if settings.reward_model is None:
        return None
    return RewardModelSpec(path=settings.reward_model, weight=settings.reward_model_weight,
                           norm=settings.reward_model_norm, batch_size=settings.reward_model_batch_size,
                           dtype=settings.reward_model_dtype, device=settings.reward_model_device,
                           max_tokens=settings.reward_model_max_tokens)


def reward_model_problems(path: str) -> list[str]:
    """Why `path` cannot be a reward model (one line, naming the field): read off its config, then loaded and
    scoring one example."""
    return config_problems(path) or loaded_problems(path)


def config_problems(path: str) -> list[str]:
    """Why `path` cannot be a reward model, read off its config alone."""
    if not os.path.isdir(path):
        return [f"reward_model: {path!r} is no folder (a local HF model folder is needed; fit one with "
                "launch/train_reward_model.py)"]
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001  (a missing or unreadable config.json: said in one line)
        return [f"reward_model: {path!r}: its config cannot be read: {str(e).splitlines()[0]}"]
    archs = config.architectures or []
    if not any(a.endswith(SEQUENCE_CLASSIFIER) for a in archs):
        return [f"reward_model: {path!r} is not a sequence classifier (its config.json names {archs or 'no'} "
                f"architectures, none *{SEQUENCE_CLASSIFIER}); fit one from a causal LM with "
                "launch/train_reward_model.py"]
    if config.num_labels not in (1, 2):
        return [f"reward_model: {path!r} has num_labels {config.num_labels}; a reward model has 1 (the score) or 2 "
                "(the score is logit[1] - logit[0])"]
    return []


def loaded_problems(path: str) -> list[str]:
    """Why the folder, loaded as --reward-model loads it, cannot score: its load report, its tokenizer's size and one
    example's score."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    where = f"reward_model: {path!r}"
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        model, report = AutoModelForSequenceClassification.from_pretrained(
            path, trust_remote_code=False, output_loading_info=True, ignore_mismatched_sizes=True)
    except Exception as e:  # noqa: BLE001  (weights or tokenizer files that do not load: said in one line)
        return [f"{where}: cannot be loaded: {type(e).__name__}: {str(e).strip().splitlines()[0]}"]
    if report["missing_keys"]:
        return [f"{where}: its weights lack {', '.join(sorted(report['missing_keys'])[:3])} (a causal LM's weights "
                "under a sequence-classification config would score with a random head); fit one with "
                "launch/train_reward_model.py"]
    if report["mismatched_keys"]:
        name, saved, wanted = sorted(report["mismatched_keys"])[0]
        return [f"{where}: its weights' {name} is {list(saved)}, its config wants {list(wanted)} (num_labels "
                f"{model.config.num_labels}): the head does not fit"]
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        return [f"{where}: its tokenizer has {len(tokenizer)} tokens, its model embeds "
                f"{model.get_input_embeddings().num_embeddings}: the tokenizer does not fit the model"]
    return example_problems(RewardModel(path, loaded=(model.eval(), tokenizer, pad_id(model, tokenizer))), where)


def example_problems(rm: "RewardModel", where: str) -> list[str]:
    """Why `rm` cannot score one short example."""
    try:
        score, = rm.raw_scores([("What is 2 + 2?", "4")])
    except Exception as e:  # noqa: BLE001  (whatever scoring raises would be raised by every scoring call)
        return [f"{where}: scoring one example failed: {type(e).__name__}: {str(e).strip().splitlines()[0]}"]
    return [] if math.isfinite(score) else [f"{where}: scores one example as {score}, not a finite number"]


def prompt_and_response(r: RolloutResult) -> tuple[str | list, str]:
    """The episode's prompt (its task's question, or its messages) and its last response."""
    steps = r.trajectory.steps
    return r.trajectory.task.get("question", ""), steps[-1].model_response if steps else ""


def render(tokenizer, prompt: str | list, response: str) -> tuple[str, bool]:
    """(text, templated): the pair through the tokenizer's chat template, or "prompt\\n\\nresponse"."""
    messages = [dict(m) for m in prompt] if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": response}],
                                             tokenize=False), True
    return "\n\n".join(m["content"] for m in messages) + "\n\n" + response, False


def encode(tokenizer, prompt: str | list, response: str, max_tokens: int) -> list[int]:
    """The pair's token ids, the first ones cut where there are more than `max_tokens` (the response is kept)."""
    text, templated = render(tokenizer, prompt, response)
    ids = tokenizer(text, add_special_tokens=not templated)["input_ids"]
    return ids[-max_tokens:]


def pad_id(model, tokenizer) -> int:
    """The id the classifier reads as padding (its last non-pad token is the one it scores); set on its config
    when missing (a model fitted from a causal LM without one)."""
    pid = model.config.pad_token_id
    if pid is None:
        pid = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        model.config.pad_token_id = pid
    return pid


def batch_tensors(rows: list[list[int]], pid: int, device):
    """(input_ids, attention_mask), right-padded with `pid`: (B, T) each."""
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pid, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, :len(r)] = 1
    return ids.to(device), mask.to(device)


def head_scores(logits):
    """(B,) scores of a (B, 1) or (B, 2) head: the logit, or logit[1] - logit[0]."""
    return logits[:, 0] if logits.shape[-1] == 1 else logits[:, 1] - logits[:, 0]


@dataclass
class RewardModel:
    """A reward source (rewards/functions.py) scoring with a frozen sequence classifier."""

    path: str
    weight: float = 1.0
    batch_size: int = 8
    dtype: str = "float32"
    device: str | None = None  # None: the device of the process's policy (use_device), else cpu
    max_tokens: int = 1024
    norm: str = "none"  # none | group | running (rewards/norm.py)
    name: str = "model"
    running: RunningNorm = field(default_factory=RunningNorm)
    default_device: str = "cpu"
    loaded: tuple | None = None  # (model, tokenizer, pad id), once this process scored

    @property
    def spec(self) -> str:
        return self.path

    def use_device(self, device) -> None:
        if device is not None:
            self.default_device = str(device)

    def load(self) -> tuple:
        if self.loaded is None:
            import torch
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            dtype = torch.bfloat16 if self.dtype in ("bfloat16", "bf16") else torch.float32
            tokenizer = AutoTokenizer.from_pretrained(self.path, trust_remote_code=False)
            model = AutoModelForSequenceClassification.from_pretrained(self.path, dtype=dtype, trust_remote_code=False)
            model.to(self.device or self.default_device).eval().requires_grad_(False)
            self.loaded = (model, tokenizer, pad_id(model, tokenizer))
        return self.loaded

    def raw_scores(self, pairs: list[tuple[str | list, str]]) -> list[float]:
        """One score per (prompt, response), nan where it is not finite."""
        import torch

        model, tokenizer, pid = self.load()
        rows = [encode(tokenizer, p, r, self.max_tokens) for p, r in pairs]
        out: list[float] = []
        with torch.inference_mode():
            for i in range(0, len(rows), self.batch_size):
                ids, mask = batch_tensors(rows[i:i + self.batch_size], pid, model.device)
                out += head_scores(model(input_ids=ids, attention_mask=mask).logits).float().tolist()
        return [v if math.isfinite(v) else math.nan for v in out]

    def __call__(self, results: list[RolloutResult], env_name: str) -> list[float | None]:
        raw = self.raw_scores([prompt_and_response(r) for r in results])
        for r, v in zip(results, raw):
            r.trajectory.steps[-1].info["reward_model_raw"] = v
        return normalise(self.norm, raw, [r.group_id or r.task_id for r in results], self.running)

    def metrics(self, scored: list[RolloutResult]) -> dict:
        """reward/model_mean, reward/model_std: the raw scores of the episodes that trained."""
        raw = [r.trajectory.steps[-1].info.get("reward_model_raw") for r in scored]
        raw = [v for v in raw if v is not None and math.isfinite(v)]
        if not raw:
            return {}
        mean, std = mean_std(raw)
        return {"reward/model_mean": mean, "reward/model_std": std}


def held_reward_model(spec: RewardModelSpec) -> list[HeldModel]:
    """The reward model each scoring process holds: one batch of --reward-model-batch-size x --reward-model-max-tokens."""
    return [HeldModel("reward model", spec.path, spec.batch_size * spec.max_tokens,
                      2 if spec.dtype in ("bfloat16", "bf16") else 4, spec.device,
                      f"{spec.batch_size} x {spec.max_tokens} tokens")]


register_reward_source("reward_model", RewardModelSpec, lambda spec: [RewardModel(**asdict(spec))],
                       lambda spec: reward_model_problems(spec.path), names=lambda spec: [spec.path],
                       held=held_reward_model, settings=RewardModelSettings, from_settings=reward_model_spec)
