"""The environment protocol: all the engine, the workers, evaluation and the trajectory dump know of an env.

An episode is an `Env` and an `Agent` on one task:

    observation = env.reset(task)                      # text, or {"question": text}
    agent.reset(task, observation)                     # chat messages; a Trajectory is opened
    loop: response = policy(agent.messages)
          agent.update_from_model(response)
          observation, reward, done, info = env.step(response)
          agent.update_from_env(observation, reward, done, info)   # next user message, unless done
    trajectory = agent.finish(episode_reward, terminated=..., reason=...)

A reward may come at any step: each step's reward is kept on its `Step` (turn credit reads it) and
the episode's reward is the sum of its steps' rewards (for an env that rewards only the last step,
that step's reward). An observation after a step is any text (retry feedback, a tool's result).

An `EnvBundle` is what `--env module.path:Name` names: how to make one episode's env and agent, the
env's own options (`--env-arg key=value`, typed by their defaults), and where its tasks come from
(rows with a unique string `task_id`; the rest of a row is the env's business).

A game (two or more players on one env; rollout/games.py, docs/self-play.md): the bundle says `seats = N`, and
the env adds `seat()`, whose move it is (read after `reset` and after each step that is not done):

    observation = env.reset(task)                      # what the first mover sees
    loop: k = env.seat()                               # the mover
          move = seat k's player(its messages)         # the policy, or --opponent's move
          observation, reward, done, info = env.step(move)   # what the NEXT mover sees; reward: the mover's
    done: info["rewards"] = [one final reward per seat]      # +1 / -1 / 0 zero-sum (missing: all 0, a draw)

`env.legal_moves() -> list[str]`, where the game lists them, lets `--opponent random` play it; info["invalid_move"]
marks a move that broke the rules (the game says how that ends: in TextArena's games, that seat loses).
Each seat the policy plays is its own trajectory with its own reward; `--opponent` says who plays the others.

Optional, beside reset/step: a bundle's `demonstrations(task) -> list[dict]`, the messages a correct episode
adds after the agent's first prompt (assistant replies, with `tool_calls` and the `tool` results where the
episode calls a tool), written as the env grades them. `launch/sft.py --env X --demos N` trains on them
(nanorllm/supervised/demos.py): the env's own gold as supervised data, no file needed.
"""

import math
import numbers
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from nanorllm.agents.chat_agent import ChatAgent
from nanorllm.core.limits import ENV_TIMEOUT_S, GRADER_TIMEOUT_S
from nanorllm.core.types import RolloutResult, Trajectory
from nanorllm.utils.modules import EnvSpecError

Observation = str | dict  # text, or {"question": text}
ENV_METHODS = ("reset", "step")
AGENT_METHODS = ("reset", "update_from_model", "update_from_env", "finish")


@runtime_checkable
class Env(Protocol):
    def reset(self, task: dict) -> Observation: ...

    def step(self, response: str) -> tuple[str | None, float, bool, dict]:
        """(next observation or None, this step's reward, done, info). info may carry "action" (what
        was graded), "reason" (why the episode ended), "success" (a bool: whether the episode succeeded, where the
        env counts success otherwise than reward > 0; the last step that says it decides) and numbers the bundle's
        `metrics` reads."""
        ...


class EnvProtocolError(TypeError):
    """What `env.reset` or `env.step` returned breaks the protocol above. The engine treats it like an
    exception in the env: that episode ends as an env error (`rollout/env_errors`), the others go on."""

    def __init__(self, field: str, expected: str, value: object):
        self.key = (field, type(value).__name__)  # one report per field and type, however many episodes
        super().__init__(f"{field}: expected {expected}, got {value!r:.80} ({type(value).__name__})")


def check_reset(observation: object) -> Observation:
    """`env.reset`'s result, if it is an observation (text, or a dict whose "question" is text)."""
    if isinstance(observation, str) or (isinstance(observation, dict) and isinstance(observation.get("question"), str)):
        return observation
    if isinstance(observation, dict):
        raise EnvProtocolError("observation['question']", "text", observation.get("question"))
    raise EnvProtocolError("observation", "text or a dict with a 'question' text", observation)


def check_step(result: object) -> tuple[str | None, float, bool, dict]:
    """`env.step`'s result, checked field by field: (text or None, a finite number, a bool, a dict whose
    "reason", if any, is text and whose "success", if any, a bool). The reward comes back as a float and `done` as a
    bool."""
    if not isinstance(result, (tuple, list)) or len(result) != 4:
        raise EnvProtocolError("env.step's result", "a tuple (observation, reward, done, info)", result)
    observation, reward, done, info = result
    if observation is not None and not isinstance(observation, str):
        raise EnvProtocolError("observation", "text or None", observation)
    if not isinstance(reward, numbers.Real) or isinstance(reward, bool):
        raise EnvProtocolError("reward", "a number", reward)
    if not math.isfinite(reward):
        raise EnvProtocolError("reward", "a finite number", reward)
    if not isinstance(done, (bool, np.bool_)):
        raise EnvProtocolError("done", "True or False", done)
    if not isinstance(info, dict):
        raise EnvProtocolError("info", "a dict", info)
    if not isinstance(info.get("reason", ""), str):
        raise EnvProtocolError("info['reason']", "text", info["reason"])
    if not isinstance(info.get("success", False), (bool, np.bool_)):
        raise EnvProtocolError("info['success']", "True or False", info["success"])
    return observation, float(reward), bool(done), info


@runtime_checkable
class Agent(Protocol):
    # the conversation so far; a turn adds one assistant message and at most one user message (or, under
    # --tools, the `tool` messages of its calls' results: envs/tools.py)
    messages: list[dict]
    trajectory: Trajectory | None

    def reset(self, task: dict, observation: Observation) -> None: ...

    def update_from_model(self, response: str) -> None: ...

    def update_from_env(self, observation: str | None, reward: float, done: bool, info: dict) -> None: ...

    def finish(self, reward: float, *, terminated: bool, reason: str) -> Trajectory: ...


@dataclass
class EpisodeSettings:
    """The run's settings every bundle may read (built from the config by nanorllm/config/specs.py)."""

    max_turns: int = 2  # the engine ends any episode after this many turns
    system_prompt: str | None = None  # None: the bundle's own
    worked_example: bool = True
    grader_timeout_s: float = GRADER_TIMEOUT_S
    env_timeout_s: float = ENV_TIMEOUT_S  # --env-timeout-s: one call to an env server (a reset, a step) past this is an env error
    task_fields: dict[str, str] | None = None  # --task-fields: question / answer / task_id -> the source's columns
    # an episode's row, prompt and completions, holds at most this many tokens (rollout/row_bound.py: an --agent
    # request past it gets a 400, an env turn ends its episode); None: the model's context. What the memory plan
    # sizes an agent episode at.
    max_row_tokens: int | None = None
    opponent: str = "self"  # --opponent: who plays a game's seats the policy does not (rollout/games.py)
    eval_opponent: str = "base"  # --eval-opponent: who plays them in held-out evaluation ("base": --model, frozen)


class EnvBundle:
    """Subclass and set `env_class` (built as env_class(max_turns=..., **options)) or override
    `make_env`; the agent is `agent_class` with the bundle's prompt and worked example."""

    name: ClassVar[str] = "env"
    env_class: ClassVar[type]
    agent_class: ClassVar[type] = ChatAgent
    system_prompt: ClassVar[str | None] = None
    example: ClassVar[tuple[str, str] | list[dict] | None] = None  # one worked exchange before the question
    args: ClassVar[dict[str, object]] = {}  # the env's own options and their defaults (--env-arg key=value)
    default_tasks: ClassVar[str | None] = None  # used when --tasks / --eval-tasks are left at their defaults
    default_eval_tasks: ClassVar[str | None] = None
    seats: ClassVar[int] = 1  # players of one episode: 2 or more is a game (see the module docstring)

    def __init__(self, settings: EpisodeSettings | None = None, **options):
        unknown = sorted(set(options) - set(self.args))
        if unknown:
            raise ValueError(f"unknown option(s) {', '.join(unknown)}")
        self.settings = settings or EpisodeSettings()
        if self.settings.opponent != "self" and self.seats == 1:
            raise EnvSpecError(f"--opponent {self.settings.opponent}: {self.name} is a one-player env; an opponent "
                               "plays the other seats of a game (an env with seats >= 2)")
        env_class = getattr(self, "env_class", None)
        if self.seats > 1 and env_class is not None and not hasattr(env_class, "legal_moves"):
            for flag in ("opponent", "eval_opponent"):
                if getattr(self.settings, flag) == "random":
                    raise EnvSpecError(f"--{flag.replace('_', '-')} random: {self.name}'s env has no legal_moves() to "
                                       f"draw a random move from; use --{flag.replace('_', '-')} self")
        self.options = {**self.args, **options}
        self.spec = self.name  # how --env named it (set by the registry)

    def make_env(self) -> Env:
        return self.env_class(max_turns=self.settings.max_turns, **self.options)

    def make_agent(self) -> Agent:
        s = self.settings
        return self.agent_class(system_prompt=self.system_prompt if s.system_prompt is None else s.system_prompt,
                                example=self.example if s.worked_example else None)

    def load_tasks(self, spec: str, *, limit: int | None = None) -> list[dict]:
        """Rows with a task_id; by default the math formats (arith:... specs, JSONL files, the `datasets` formats
        with the run's --task-fields)."""
        from nanorllm.datasets.tasks import load_tasks

        return load_tasks(spec, limit=limit, fields=self.settings.task_fields)

    def metrics(self, results: list[RolloutResult]) -> dict:
        """The env's own scalars for a batch of episodes (logged beside the rollout metrics)."""
        return {}

    def use_tokenizer(self, tokenizer) -> None:
        """Told the policy's tokenizer before any episode runs (the engine does it): a bundle whose episodes
        read the model's own format, as --tools reads its tool calls, resolves it here."""

    def use_tools(self, names: list[str]) -> None:
        """Told the --tools functions' names when they wrap this bundle (envs/tools.py ToolBundle): a bundle whose
        prompt teaches a call (CalcTasks) teaches only a call the episodes can make."""
