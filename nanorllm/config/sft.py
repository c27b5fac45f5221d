"""The SFT program's config (launch/sft.py): the training groups it reads, composed as TrainConfig composes them,
and one group of its own; no RL-only field (tests/test_sft_config.py: every field is read by an SFT run).

Its fields mean what they mean in training (fields.Learner: --micro-batch-tokens, --max-pad-frac,
--packing, --tf32; fields.Optimizer: --lr, --weight-decay, --max-grad-norm, --lr-schedule, --warmup-steps (RL's
schedule, trainer/schedule.py, over this run's steps); fields.LearnerForward:
--disable-dropout, --grad-checkpointing; fields.MemoryPlanning's --memory-plan-only (memory/sft_plan.py);
fields.LoraAdapters; fields.LearnerRankSettings' --devices (its first entry) and learner ranks (--learner-devices N:
the first N, each step's rows split over them; --learner-parallel, --learner-timeout-s);
fields.RunLog's folder, sinks and checkpoints, --eval-every for the held-out loss; fields.ModelSettings' --model,
--dtype, --threads; fields.EnvOptions' --env, --env-arg, --task-fields; fields.ToolFunctions' --tools;
fields.TrainingTasks' --tasks (the tasks --demos draws from) and --limit (--data's rows);
fields.FirstPrompt's --system-prompt and --worked-example, which shape a demonstration's prompt as they shape
RL's). fields.Steps read as TRL's trainer reads them: --epochs counts passes over the data, and --max-steps, when
not 0, is the number of optimizer steps instead, the data read as many times as they take. This program's own
defaults (`SFT_DEFAULTS`) are values, not second declarations of those fields.
"""

from dataclasses import asdict, dataclass
from typing import Literal

from nanorllm.config.checks import bound_problems
from nanorllm.config.fields import (Alarms, Devices, EnvOptions, Episodes, FirstPrompt, Learner, LearnerForward,
                                    LearnerRankSettings, LoraAdapters, MemoryPlanning, ModelSettings, Optimizer, RunLog,
                                    Seeding, Sources, Steps, ToolFunctions, TrainingTasks)

SFT_DEFAULTS = {"max_steps": 0, "lr": 1e-5, "packing": True, "exp_name": "sft"}


@dataclass
class Resuming:
    """A supervised program's way back into its run folder (launch/sft.py, launch/train_reward_model.py)."""

    resume: str | None = None
    """A run folder of this program to continue from its newest checkpoint (give the same flags)."""


@dataclass
class Overwriting:
    """What a program may do to what --out already holds (nanorllm/utils/outputs.py)."""

    overwrite: bool = False
    """Replace what --out holds when it is not this program's own earlier output (a folder of other files, an
    existing file); without it such an --out is refused before anything loads."""


@dataclass
class SFTSettings:
    """What SFT trains on and where its model goes."""

    data: str | None = None
    """SFT rows: a JSONL file, a parquet file or folder, or hf:NAME (nanorllm/supervised/sft_data.py): TRL's
    `messages` (tool calls and role `tool` included, a `tools` column), `prompt`/`completion` or `text` rows (language
    modelling: every token trained)."""
    demos: int = 0
    """Instead of --data: this many demonstrations from --env's own gold (its `demonstrations(task)`, on its
    training tasks)."""
    out: str | None = None
    """The folder the fine-tuned model is written to (HF format; LoRA: merged), which `launch/train.py --model`
    starts from."""
    sft_loss: Literal["assistant", "all"] = "assistant"
    """Which tokens are trained: 'assistant' (every assistant reply, as the policy would sample it) or 'all' (the
    whole conversation after its first token)."""
    rows_per_step: int = 8
    """Conversations per optimizer step."""
    eval_frac: float = 0.0
    """Share of the rows held out (by --seed); their loss is logged as sft/eval_loss before, every --eval-every
    steps and after training."""
    max_tokens: int | None = None
    """Longest conversation in tokens; a longer row is refused, named. None: the model's context."""


@dataclass
class SFTConfig(SFTSettings, Overwriting, Resuming, RunLog, LearnerRankSettings, MemoryPlanning, LearnerForward,
                LoraAdapters, Steps, Optimizer, Learner, FirstPrompt, TrainingTasks, ToolFunctions, EnvOptions,
                ModelSettings):
    """Supervised fine-tuning on conversations, with the learner RL uses (docs/warm-start.md)."""

    def validate(self) -> list[str]:
        """Every problem, one line each, naming the field."""
        p = bound_problems(self, {**dict.fromkeys(["epochs", "rows_per_step", "keep_checkpoints"], ">= 1"),
                                  **dict.fromkeys(["max_steps", "demos", "save_every", "eval_every", "lora_rank",
                                                   "warmup_steps"], ">= 0"),
                                  **dict.fromkeys(["threads", "limit", "micro_batch_tokens", "max_tokens"],
                                                  ">= 1 or unset"),
                                  "lr": "> 0", "max_grad_norm": "> 0"})
        if (self.data is None) == (self.demos == 0):
            p.append("data: give --data FILE or --demos N (demonstrations from --env), one of them")
        if self.out is None:
            p.append("out: give --out FOLDER, where the fine-tuned model is written")
        if not 0 <= self.eval_frac < 1:
            p.append(f"eval_frac: must be in [0, 1), got {self.eval_frac}")
        if self.warmup_steps >= self.max_steps >= 1:
            p.append(f"warmup_steps: {self.warmup_steps} is not below max_steps ({self.max_steps}): the run never "
                     "reaches --lr")
        return p

    def saved(self) -> dict:
        return asdict(self)


@dataclass
class SampleSettings:
    """Rejection sampling: what is sampled, what is kept and where it goes."""

    out: str | None = None
    """The JSONL file the kept episodes are written to, as SFT rows (prompt/completion conversations, their reward)."""
    samples_per_task: int = 8
    """Episodes sampled per task (at --temperature)."""
    min_reward: float = 1.0
    """Keep episodes whose reward is at least this."""


@dataclass
class SampleConfig(SampleSettings, Overwriting, Devices, Seeding, Episodes, Alarms, Sources):
    """Sample episodes from a model on an env and keep the rewarded ones as SFT rows (RFT / STaR / expert
    iteration; launch/sample.py). --seed seeds the sampling; the task, env and episode fields mean what they mean
    in training."""

    def validate(self) -> list[str]:
        """Every problem, one line each, naming the field."""
        p = bound_problems(self, {"samples_per_task": ">= 1", "max_new_tokens": ">= 1", "max_turns": ">= 1",
                                  "temperature": "> 0", "limit": ">= 1 or unset", "threads": ">= 1 or unset"})
        if self.out is None:
            p.append("out: give --out FILE.jsonl, where the kept episodes are written")
        return p
