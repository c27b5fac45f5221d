"""The configs' fields, each declared once in a small group: a dataclass per concern, composed by each program.

A program's config is the groups it reads, composed by inheritance: every field stays one flat flag
(`max_steps` is `--max-steps`), one flat key of a config file and of config.json, and one flat attribute
(`cfg.max_steps`), while a function that reads one concern takes that group's type (the loss takes an
`Objective`, the groups it reads; a TrainConfig, which is one, can be handed to it as it is). Training's
`TrainConfig` is all of them; `launch/eval.py`'s `EvalConfig` (trainer/eval_model.py) takes the model, env,
reward, tool, episode-shape, decode, eval and judge groups, so a flag means the same in both by the same name.
Where a program reads only part of a group, that part is a group of its own and the wider group composes it
(`Lora(LoraAdapters)`: SFT's config takes the adapters' shape, not the forms RL's final model keeps them in), so
no program carries a flag it does not read.
A new program composes its own the same way, adding only the fields no group holds:

    @dataclass
    class SFTConfig(Program, RunLog, Steps, Learner, AdamWSettings, LoraAdapters, TaskSources, ModelSettings):
        rows_per_step: int = 8
        "Conversations per optimizer step."

(the last base class's fields come first in its flags and in config.json). `Program` gives every program the
same reading of a file's lists. Checks live in checks.py, the file loader in files.py, the command line in cli.py.
A reward source's flags are declared in its own module in rewards/ (rewards/sources.py) and composed here.
"""

import types
from dataclasses import asdict, dataclass
from typing import Annotated, Literal, Protocol, get_origin, get_type_hints, runtime_checkable

import tyro

from nanorllm.algos.advantages import ESTIMATORS
from nanorllm.core.limits import (AGENT_TIMEOUT_S, ENV_TIMEOUT_S, GRADER_TIMEOUT_S, MAX_TOOL_CALLS,
                                  TOOL_TIMEOUT_S)
from nanorllm.envs.registry import DEFAULT_ENV
from nanorllm.policy.tool_calls import PARSERS
from nanorllm.rewards.functions import RewardFunctions
from nanorllm.rewards.judge import JudgeSettings
from nanorllm.rewards.model import RewardModelSettings


@dataclass
class ModelSettings:
    """The model, its precision and its CPU threads: what every program that loads a model reads."""

    model: str = "smollm2-135m-instruct"
    """Built-in name (smollm2-135m-instruct, tiny-random), a local HF model directory or a hub id."""
    dtype: Literal["auto", "float32", "bfloat16", "fp32", "bf16"] = "auto"
    """'auto' (bf16 where every device the run uses has bf16 units: a CPU with avx512_bf16 or AMX, a GPU from
    Ampere on; fp32 elsewhere; the choice and why are printed and kept in config.json), or 'float32' / 'bfloat16'
    (aliases fp32, bf16) to force one: bf16 computes in bf16 over fp32 master weights and optimizer state;
    workers sample with bf16 replicas and the weight broadcast moves bf16."""
    threads: int | None = None
    """Torch threads per process on CPU; None splits the cores across processes."""


@dataclass
class Seeding:
    """The seed of a program's randomness."""

    seed: int = 0
    """Seed for task order, sampling and initialisation."""


@dataclass
class EnvOptions:
    """The env, its options and the task sources' columns: what loading its tasks and first prompts reads."""

    env: str = DEFAULT_ENV
    """The environment bundle (docs/environments.md): 'math' (self-refine), 'calc' (a calculator tool),
    module.path:Name or path/to/file.py:Name."""
    env_arg: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """The env's own options, key=value, one flag each (--env-arg a=1 --env-arg b=2); a config file may give a mapping."""
    task_fields: str | None = None
    """The sources' own column names, key=column, comma-separated. Tasks (training, evaluation, sampling, --demos):
    keys question, answer, task_id (question=problem,answer=solution,task_id=id; a source without a task_id column
    gets <source>-<row> ids). launch/sft.py's --data rows: keys messages, prompt, completion, tools, text
    (messages=conversations,tools=functions)."""


@dataclass
class EnvSource(EnvOptions):
    """What an episode is: its env (or agent), the env's options and limits, and the task sources' columns."""

    agent: str | None = None
    """An agent written against the OpenAI client instead of an env (docs/environments.md): path/to/file.py:fn or
    module.path:fn, fn(task, client) -> reward or {"reward": ..., ...}, sync or async. Each rollout worker serves
    it an OpenAI-compatible endpoint on 127.0.0.1; give --tasks. Not with --env."""
    agent_timeout_s: float = AGENT_TIMEOUT_S
    """An --agent episode (or a verifiers env's, which runs on the same endpoint) still running this long after it
    started is ended as an env error (rollout/agent_timeouts)."""
    env_timeout_s: float = ENV_TIMEOUT_S
    """Wall-clock limit (seconds) of one call to an env server (--env openenv:...: a reset or a step); past it that
    episode ends as an env error (rollout/env_errors), and a server that does not answer at start is refused."""


@dataclass
class ToolFunctions:
    """The episodes' Python tools (docs/tools.md)."""

    tools: str | None = None
    """Python functions the episodes may call (docs/tools.md): path/to/tools.py:fn1,fn2, module.path:fn1,fn2, or a
    file/module whose TOOLS list holds them; each needs type hints and a docstring with an Args: section (its JSON
    schema is transformers' get_json_schema). Any --env; not with --agent (its requests carry their own tools)."""


@dataclass
class ToolSettings(ToolFunctions):
    """Python functions as the episodes' tools (docs/tools.md)."""

    tool_parser: Literal[("auto", *PARSERS)] = "auto"
    """The tool-call format read out of the model's replies, by the --agent endpoint and under --tools
    (docs/tools.md); auto: the one the policy's chat template writes (hermes where the fallback block renders
    the tools)."""
    max_tool_calls: int = MAX_TOOL_CALLS
    """Tool calls an episode may make under --tools; after them a reply goes to the env as its answer."""
    tool_timeout_s: float = TOOL_TIMEOUT_S
    """Wall-clock limit (seconds, at most a day) of one tool call; past it the tools' helper process is killed and
    the call's result is an error text (counted in rollout/tool_errors)."""




@dataclass
class TrainingTasks:
    """The training task source."""

    tasks: str | None = None
    """Training tasks in the env's format: for math, a JSONL file (seed schema or GSM8K format) or an arith:...
    spec. None: the env's own default tasks (math: arith sums and differences 0-20); the run's config.json
    records the spec it resolved to."""
    limit: int | None = None
    """Use only the first N training tasks."""


@dataclass
class TaskSources(TrainingTasks):
    """The training and held-out task sources."""

    eval_tasks: str | None = None
    """Held-out tasks, same formats, or holdout:frac=F,seed=S:SPEC ('': none). None: with --tasks, a seeded tenth
    of them (holdout:frac=0.1,seed=0:TASKS); without, the env's own held-out set. Tasks also held out are removed
    from training."""


@dataclass
class TaskSampling:
    """Which training tasks each step draws (datasets/stream.py, datasets/sampler.py, docs/tasks.md)."""

    task_sampler: Literal["uniform", "signal"] = "uniform"
    """'uniform': every task once per epoch, in a seeded shuffled order. 'signal': draw toward the tasks whose
    pass-rate estimate lies in --sampler-band (they give groups whose rewards differ), explore unseen tasks,
    revisit solved and hopeless ones rarely (docs/tasks.md)."""
    sampler_band: tuple[float, float] = (0.2, 0.8)
    """signal: the band [low, high] of pass-rate estimates m drawn by m(1 - m); outside it by --sampler-revisit."""
    sampler_explore: float = 0.25
    """signal: the chance each pick is a task not seen yet, while any is left."""
    sampler_revisit: float = 0.05
    """signal: the chance a pick goes back to a task outside the band (solved or hopeless), whatever their number."""


@dataclass
class Sources(TaskSources, RewardModelSettings, RewardFunctions, ToolSettings, EnvSource, ModelSettings):
    """What to train on: the model, the episodes' env or agent, their tools, rewards and task sources. A group of
    groups, no field of its own."""


@dataclass
class Alarms:
    """The warnings a run gives once its first steps show a tool-call format mismatch or a collapsed policy."""

    tool_alarm_steps: int = 3
    """With --tools: when the first this-many steps parse no tool call at all, one warning names the parser,
    the template and a raw response (a format mismatch shows in a minute). 0: off."""
    collapse_alarm_steps: int = 5
    """When this many steps in a row, each with a reward mean below 1, held one distinct final answer in every group
    with one answer more than half of their episodes (a constant guess), or spread their final answers over at most
    half as many effective answers as their tasks' golds (a few guesses whatever the question), one warning names
    the answers and their shares (docs/metrics.md). Counted afresh after a resume. 0: off."""



@dataclass
class EvalSettings:
    """How held-out sets are evaluated beyond greedy success; `launch/eval.py` takes the same fields."""

    eval_limit: int | None = None
    """Evaluate only the first N held-out tasks (and of each --eval-set); training leaves out the whole held-out
    set whatever N."""
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


@dataclass
class PromptLimit:
    """How long a first prompt may be."""

    max_prompt_tokens: int | None = None
    """Longest first prompt (chat template, system prompt, worked example, question) in tokens; a task over it is
    refused at start, naming it. None: the model's context less the room the turns need (responses, feedback)."""
    drop_long_prompts: bool = False
    """Leave tasks whose prompt is over the limit out (counted, the first named) instead of refusing the run."""


@dataclass
class FirstPrompt:
    """What an episode's first prompt holds beside the question."""

    system_prompt: str | None = None
    """System prompt; None uses the built-in one."""
    worked_example: bool = True
    """Put one worked question/answer pair before the question (teaches the \\boxed{} format)."""


@dataclass
class Turns:
    """How many turns an episode has and how long each response may be."""

    max_turns: int = 2
    """Self-refine turns per episode: a wrong answer gets retry feedback until this many turns."""
    max_new_tokens: int = 32
    """Longest response per turn; a response cut here ends its episode as 'truncated'."""


@dataclass
class EpisodeShape(Turns, FirstPrompt):
    """One episode's turns, its responses' length, its prompt and its grading: the same in training and evaluation."""

    grader_timeout_s: float = GRADER_TIMEOUT_S
    """CPU-time limit (seconds, not wall-clock) for one symbolic answer check; numeric answers need none."""
    opponent: str = "self"
    """Two-player games (an env with seats, docs/self-play.md): who plays the seats the policy does not. self: the
    policy plays every seat and every seat trains; random: a random legal move (the game must list them); http(s)://
    host:port/v1[#MODEL]: a model behind an OpenAI-compatible endpoint; any other value is a model (a folder, a hub
    id, a built-in name) played frozen at its weights, sampling at --temperature.
    pool: the policy's own earlier weights, a snapshot every --pool-every steps, the last --pool-size kept, each game's
    opponent drawn from them (rollout/opponent_pool.py).
    Against an opponent the policy plays one seat a game, turn about over a task's games."""
    eval_opponent: str = "base"
    """Two-player games: who plays held-out evaluation's other seat (the run's and launch/eval.py's): base, the model
    the run started from (--model), frozen: an opponent the eval number does not move with, as the policy's own seats
    improve; random: a random legal move (the game must list them); self: the policy itself; or, as --opponent, an
    endpoint or any other model, frozen."""


@dataclass
class SnapshotPool:
    """`--opponent pool`: which of the policy's earlier weights play a game's other seats (docs/self-play.md)."""

    pool_every: int = 4
    """--opponent pool: the policy's weights join the pool every this many steps (step 0's are --model)."""
    pool_size: int = 3
    """--opponent pool: the pool is the last this many snapshots; each game's opponent is one of them, and each
    process that rolls out holds them all (the memory plan counts them)."""


@dataclass
class Sampling:
    """How training rollouts sample."""

    temperature: float = 0.7
    """Sampling temperature for training rollouts (evaluation is greedy)."""
    top_p: float = 1.0
    """Nucleus sampling mass; training needs 1.0 (the learner scores the full distribution), eval may truncate."""


@dataclass
class Episodes(Sampling, EpisodeShape, PromptLimit):
    """One episode: its first prompt's limit, its turns and how each response is sampled and graded."""


@dataclass
class DecodeBatch:
    """The running decode batch (training rollouts and evaluation)."""

    max_batch_episodes: int = 256
    """Most rows in one running decode batch (a whole 200-task eval fits; KV memory grows with it)."""
    cuda_graphs: bool = True
    """On a GPU, replay the decode step from CUDA graphs captured per batch-size bucket (no effect on CPU)."""


@dataclass
class LossSettings:
    """The clipped objective and its variants (trainer/loss.py; the loss reads them in an `Objective`)."""

    clip_low: float = 0.2
    """PPO clip: ratio floor is 1 - clip_low."""
    clip_high: float = 0.28
    """PPO clip: ratio ceiling is 1 + clip_high."""
    loss_agg: Literal["token-mean", "seq-mean", "seq-mean-token-sum-norm"] = "token-mean"
    """token-mean: the step's response tokens weigh the same; seq-mean: each sample's token mean weighs the same;
    seq-mean-token-sum-norm (Dr. GRPO): each sample's token sum / max_new_tokens, a constant, averaged over samples."""
    kl_coef: float = 0.0
    """KL-to-reference coefficient; > 0 loads a frozen copy of the initial model."""
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


@dataclass
class AdamWSettings:
    """AdamW and the gradient clipping before its step."""

    lr: float = 6e-6
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""


@dataclass
class Optimizer(AdamWSettings):
    """AdamW and its learning-rate schedule."""

    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning rate over the run's steps after warmup: constant, linear decay to 0 or cosine decay to 0
    at its last step (training's max_steps; launch/sft.py's steps), a function of the step, so a resume continues
    it exactly."""
    warmup_steps: int = 0
    """Steps of linear warmup from lr / (warmup_steps + 1) to lr, before lr_schedule applies."""


@dataclass
class Passes:
    """The forward/backward passes of a step: their token budget, padding and matmul precision."""

    micro_batch_tokens: int | None = None
    """Padded tokens per forward/backward micro-batch (bounds memory). None: 4096 on CPU; on CUDA what fits in
    the free memory by the model's size (trainer/micro_batches.py)."""
    max_pad_frac: float | None = None
    """Padding share of a step's micro-batches (perf/pad_frac) above which rows are bucketed by length into more
    micro-batches; 1: never. None: 0.2 on CUDA, never on CPU (regrouping moves float sums, and the seed's result)."""
    tf32: bool = True
    """On CUDA the update's fp32 matmuls run on TF32 tensor cores (trainer/precision.py); sampling stays fp32.
    Means nothing on CPU."""


@dataclass
class Learner(Passes):
    """The learner's forward/backward: micro-batches, packing and matmul precision."""

    packing: bool = False
    """Lay a micro-batch's rows end to end in rows of its longest width (no pad tokens computed but a row's tail;
    attention kept within each sequence, trainer/collate.py) instead of padding each. Off (RL's default): padded
    rows compute their shared prompt template once (docs/learner-update.md compares the two)."""


@dataclass
class Steps:
    """How long training runs: its optimizer steps and passes."""

    max_steps: int = 24
    """Optimizer steps. Training: its learner updates. launch/sft.py: the steps the run makes, over the data as
    many times as they take, in place of --epochs, as TRL's max_steps (0: as many as --epochs make).
    launch/train_reward_model.py: a cap on the steps its --epochs make (0: none)."""
    epochs: int = 1
    """Passes. Training: over each rollout batch (each pass makes updates_per_batch optimizer steps).
    launch/sft.py: over the data, when --max-steps is 0. launch/train_reward_model.py: over the data."""


@dataclass
class GroupShape:
    """A step's groups: how many tasks, how many episodes each, and how few may be left of one."""

    tasks_per_step: int = 4
    """Groups (distinct tasks) per update."""
    num_samples_per_task: int = 8
    """Episodes per task: the GRPO group size. 8 of 4 tasks beat 4 of 8 on the main job (docs/learning.md): fewer
    groups, but more of the same 32 episodes in groups with mixed rewards."""
    min_group_size: int = 2
    """A group left with fewer episodes than this after its failed ones (env errors, reward scores that could not be
    computed) leave it is dropped whole (rollout/groups_dropped); with at least this many it trains on them."""


@dataclass
class Advantages:
    """The advantage estimator and its settings, whether groups without signal train, and how an episode's turns
    share its credit (algos/advantages.py)."""

    adv_estimator: Annotated[str, tyro.conf.arg(metavar="{" + ",".join(ESTIMATORS) + "}|FILE.py:FN|MODULE:FN")] = "grpo"
    """grpo: reward - group mean [/ group std]; rloo: reward - the mean of the group's other episodes;
    reinforce++: reward - group mean, then whitened by the mean and std over the whole step's response tokens
    (REINFORCE++-baseline as verl and OpenRLHF compute it); rae: reward - a running baseline per game and seat
    (SPIRAL's role-conditioned advantage, for two-player games). Also any name registered with algos/advantages.py's
    register_estimator, or a user's fn(sets, spec) as path/to/file.py:fn or module.path:fn, imported and registered
    under that spec (docs/algorithms.md). adv_normalize_std applies to grpo only."""
    rae_decay: float = 0.95
    """rae (games): each game-and-seat baseline moves as b <- rae_decay x b + (1 - rae_decay) x the step's mean reward
    in that role (SPIRAL's 0.95); kept across steps and in checkpoints."""
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


@dataclass
class MiniBatches:
    """How a rollout batch is cut into optimizer steps."""

    updates_per_batch: int = 1
    """Optimizer steps per rollout batch: its groups split into this many mini-batches (by task-stream position
    mod this), one step each. A step (max_steps, checkpoints, published weights, lr_schedule) is still one
    rollout batch."""


@dataclass
class Update(MiniBatches, Advantages, GroupShape, Steps, Learner, Optimizer, LossSettings):
    """A step's update: its groups and their advantages, how its batch is cut into optimizer steps and passed over,
    the learner's passes, the optimizer and the loss. A group of groups, no field of its own."""


@dataclass
class Distillation:
    """On-policy distillation from a frozen teacher (trainer/teacher.py, docs/distillation.md)."""

    teacher: str | None = None
    """A model --model takes, sharing the student's tokenizer, frozen: it scores every token the student samples,
    and each token's advantage gets -distill_coef x (log p_student - log p_teacher), the per-token reverse KL.
    None: no teacher."""
    distill_coef: float = 1.0
    """Weight of the per-token reverse KL to the --teacher in the advantage."""
    distill_only: bool = False
    """Train on the --teacher's signal alone: the env's reward is still computed, logged and evaluated, but its
    advantage is 0."""
    teacher_device: str | None = None
    """Where the --teacher runs (cpu, cuda, cuda:N). None: the learner's device (each learner rank's)."""


@dataclass
class Objective(Distillation, LossSettings, Sampling, Turns):
    """What the loss reads (trainer/loss.py `compute_policy_loss`): the clipped objective and its variants, the
    teacher's signal, the temperature the rollouts sampled at (the learner's logprobs are taken at it) and
    max_new_tokens (Dr. GRPO's per-sample constant). A group of groups, no field of its own: a TrainConfig is one."""


@dataclass
class LoraAdapters:
    """LoRA adapters: which layers get them and their shape (policy/lora.py, docs/lora.md)."""

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


@dataclass
class Lora(LoraAdapters):
    """LoRA adapters and the forms the final model keeps them in."""

    lora_merged: bool = True
    """With LoRA, final_model/ holds the adapter (peft's format) and final_model/merged/ the adapter merged into the
    base (loadable by transformers alone); --no-lora-merged skips merged/."""


@dataclass
class LearnerForward:
    """The learner's forward: dropout (what the sampler computes) and activation checkpointing."""

    disable_dropout: bool = True
    """Run the learner's forward without dropout (eval mode), like the sampler, so fresh samples have ratio 1."""
    grad_checkpointing: bool = False
    """Activation checkpointing (transformers' own, non-reentrant): each decoder layer keeps only its input for the
    backward and is recomputed there: less learner memory for more compute; turns the shared-prompt-prefix forward off."""


@dataclass
class MemoryPlanning:
    """The memory plan every training program checks at start (nanorllm/memory/plan.py, docs/memory.md)."""

    memory_plan_only: bool = False
    """Print the run's memory plan (nanorllm/memory/plan.py, docs/memory.md) and exit 0 without loading anything."""


@dataclass
class DapoSettings:
    """DAPO's techniques beyond its clip (the loss's clip_high): overlong filtering, dynamic sampling (fill-batch)
    and the soft overlong punishment."""

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


@dataclass
class Devices:
    """Where the learner runs."""

    devices: str = "auto"
    """'auto', 'cpu', or a list like 'cuda:0,cuda:1': the first is the learner's, the rest the workers' (programs
    without workers use the first: launch/sample.py, and launch/sft.py without --learner-devices)."""


@dataclass
class LearnerRankSettings(Devices):
    """Learner ranks: one step's rows trained data-parallel over several devices (ranks/group.py)."""

    learner_devices: str | None = None
    """Learner ranks (data-parallel, ranks/group.py): a count ('2': the first 2 devices of --devices) or a list
    ('cuda:0,cuda:1'); workers share the devices left. None: one rank on the first device (under torchrun, one per
    process torchrun starts on the node). launch/sft.py spawns its ranks itself and splits each step's rows over
    them by tokens."""
    learner_parallel: Literal["ddp", "fsdp"] = "ddp"
    """How the learner ranks split the model: 'ddp' (each holds the whole model, its gradients and its optimizer
    state) or 'fsdp' (each holds 1/N of them, ranks/fsdp.py: for a model whose optimizer state does not fit one
    device; rank 0 still holds the full weights). fsdp needs more than one learner rank."""
    learner_timeout_s: float = 1800.0
    """Longest a learner rank waits for the others in one collective (a hung rank stops the run after this): more than
    the longest held-out eval or wait for rollouts, which the other ranks spend waiting for rank 0. Until the first
    step's batch is shared (ranks and workers have started) the limit is --worker-start-timeout-s, if longer.
    inf: no limit."""


@dataclass
class Processes(LearnerRankSettings):
    """Processes and devices: the rollout workers, the learner ranks and what passes between them."""

    serial: bool = False
    """Run rollout and learning in this one process (the debug path)."""
    num_workers: int = 1
    """Rollout worker processes (pipeline mode)."""
    max_policy_lag: int = 1
    """Drop samples generated by weights more than this many versions behind the learner."""
    queue_size: int = 4
    """Most finished episode batches a worker holds while the learner has not taken them (then it waits)."""


@dataclass
class RunLog(Seeding):
    """The run folder: its sinks, held-out evaluations and checkpoints."""

    output_dir: str = "runs"
    """Where run folders go."""
    run_name: str | None = None
    """Run folder name; None makes <tasks>__<exp>__<seed>__<timestamp>."""
    report_to: str = "tensorboard"
    """Where scalars go, a comma list: tensorboard, jsonl (runs/<run>/metrics.jsonl, one object per step), wandb
    (pip install -e .[wandb]; WANDB_MODE=offline needs no network)."""
    exp_name: str = "grpo"
    """Experiment name used in the run folder name."""
    eval_every: int = 0
    """Evaluate held-out tasks every N steps (launch/sft.py: the held-out rows' loss) (0: only before and after
    training)."""
    save_every: int = 0
    """Checkpoint every N steps (0: only at the end)."""
    keep_checkpoints: int = 3
    """Checkpoints kept on disk."""


@dataclass
class RunFolder(RunLog):
    """The run folder, logging and checkpoints, with what an RL run keeps beside them: trajectories as text,
    rollouts.jsonl, the final model."""

    resume_new_data: bool = False
    """With --resume: accept a task order that differs from the checkpoint's (another task file, seed, limit or
    held-out set); it starts at a new epoch. Never saved: each resume decides."""
    sample_every: int = 10
    """Log a few whole trajectories as text every N steps."""
    rollout_dump_size: int = 512
    """Most recent episodes kept in runs/<run>/rollouts.jsonl."""
    save_model: bool = True
    """Save the final model in HF format under runs/<run>/final_model. --no-save-model skips only that folder: the
    last step's checkpoint (weights and optimizer state, what --resume reads) is still written under checkpoints/."""


@dataclass
class Faults:
    """Faults: hangs, restarts, and how much may fail before the run stops as failed."""

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


class AllOf:
    """`AllOf[A, B, C]`: a config that composes every one of the groups A, B and C, what a function that reads
    several groups takes (`A | B | C` would say any one of them will do). A runtime-checkable Protocol whose
    attributes are the groups' fields, made once per combination, so a TrainConfig, an EvalConfig or any object
    with those fields is one, by its fields, not by its bases."""

    _made: dict[tuple[type, ...], type] = {}

    def __class_getitem__(cls, groups: type | tuple[type, ...]) -> type:
        groups = groups if isinstance(groups, tuple) else (groups,)
        if groups not in cls._made:
            hints = {name: hint for group in groups for name, hint in get_type_hints(group).items()}
            name = f"AllOf[{', '.join(g.__name__ for g in groups)}]"
            made = types.new_class(name, (Protocol,), exec_body=lambda ns: ns.update(__annotations__=hints,
                                                                                      __module__=__name__))
            cls._made[groups] = runtime_checkable(made)
        return cls._made[groups]


DTYPE_CHOICE = "dtype_choice"
"""A key config.json holds beside the fields: how --dtype was chosen (utils/precision.py), a record, not a setting."""


class Program:
    """What every program's config shares beyond its groups: the lists a config file or a saved config gives
    made the tuples its fields hold (an env_arg mapping made key=value items)."""

    def __post_init__(self):
        for name, hint in get_type_hints(type(self)).items():
            value = getattr(self, name)
            if name == "env_arg" and isinstance(value, dict):
                value = tuple(f"{k}={v}" for k, v in value.items())
            if get_origin(hint) is tuple:
                setattr(self, name, tuple(value))


@dataclass
class TrainConfig(Program, Faults, RunFolder, Processes, DapoSettings, MemoryPlanning, LearnerForward, TaskSampling,
                  Lora, Objective, Update, DecodeBatch, SnapshotPool, Episodes, EvalSettings, JudgeSettings, Alarms,
                  Sources):
    """The one source of truth for a run: every field documented, a flag and a config-file key each.

    Defaults here -> overridden by `--config FILE` (JSON or YAML) -> overridden by command-line flags.
    `validate()` reports every problem a config has on its own terms at once, naming the field; what it
    needs the world for (an env's module, reward files, the output folder, wandb) the run's assembly checks
    (nanorllm/run/world.py), beside these when the command line is parsed."""

    def validate(self) -> list[str]:
        """Every problem, one line each, naming the field (checks.py)."""
        from nanorllm.config.checks import config_problems

        return config_problems(self)

    def saved(self) -> dict:
        """The fields as written beside the run and into checkpoints (a one-resume decision left out)."""
        return {**asdict(self), "resume_new_data": False}

    @classmethod
    def from_saved(cls, saved: dict) -> "TrainConfig":
        """A run's config.json (or a checkpoint's config) as a config; the records beside its fields left out."""
        return cls(**{k: v for k, v in saved.items() if k != DTYPE_CHOICE})

