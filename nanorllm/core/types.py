"""The objects that flow through nanorllm.

Two views of one episode travel together:
- `Trajectory` / `Step`: what happened (interaction semantics, readable text). No tokens.
- `StepSample`: what the trainer needs (token ids and the logprobs the sampler saw), one per turn.
`RolloutResult` binds them, so a worker can ship an episode as one object and a learner can
fill in advantages without losing which samples belong to which trajectory. `RolloutBatch` is what
one engine call returns: its episodes, and how the call spent its time (once, not per episode).

Everything here is plain Python data (str, int, float, list, dict) so it pickles cheaply across
a multiprocessing queue; only the learner turns samples into tensors.
"""

from dataclasses import dataclass, field
from typing import NamedTuple

# an episode that says nothing about the policy: the env raised ("error"), or a reward source could not compute
# its score ("reward_failed": it raised, timed out, or gave nan/inf); left out of its group, never trained as a 0
FAILED_REASONS = ("error", "reward_failed")


def success(steps: list["Step"], reward: float) -> bool:
    """Whether `steps` (an episode, or its first turn) succeeded: the env's own word, info["success"] of the last
    step that has one (a game won, a full score: an env may count success apart from its reward), else reward > 0."""
    said = [s.info["success"] for s in steps if "success" in s.info]
    return bool(said[-1]) if said else reward > 0


def ending(reason: str | None, reward: float, *, cut: bool, otherwise: str = "max_turns") -> str:
    """Why an episode its env ended did end: when its last response was `cut` at max_new_tokens and earned nothing,
    "truncated", whatever the env said (its turn limit, a wrong answer, an invalid move: the cut is what happened);
    else the env's `reason`, else "correct" when rewarded, else `otherwise`."""
    if cut and reward <= 0:
        return "truncated"
    return reason or ("correct" if reward > 0 else otherwise)


@dataclass
class Step:
    """One turn: observation -> model response -> env feedback."""

    observation: str  # what the agent was shown this turn (the question, retry feedback, a tool's result...)
    model_response: str = ""  # the policy's text
    action: str | None = None  # what the env graded (info["action"], or the math env's extracted \boxed{} answer)
    reward: float = 0.0  # this step's reward; the episode's is the sum of its steps'
    done: bool = False
    feedback: str | None = None  # the env's observation for the next turn, None when done
    info: dict = field(default_factory=dict)


@dataclass
class Trajectory:
    """One whole episode on one task."""

    task_id: str
    steps: list[Step] = field(default_factory=list)
    final_reward: float = 0.0
    terminated: bool = False  # the env said done (solved, or failed on the last allowed turn)
    termination_reason: str = ""  # "correct" | "max_turns" | "truncated" | "error" | "reward_failed"
    task: dict = field(default_factory=dict)  # the task record (task_id, question, answer)

    @property
    def num_turns(self) -> int:
        return len(self.steps)


@dataclass
class StepSample:
    """One turn as a training sample. Plain lists; padded into tensors only by the learner.

    prompt_ids: (P,) every token the model was conditioned on this turn (history included)
    response_ids: (R,) the tokens the policy sampled this turn
    rollout_logprobs: (R,) log p(token) under the sampling policy (temperature applied)
    """

    task_id: str
    episode_id: str  # unique per episode; samples of one episode share it
    turn: int  # 0-based turn index inside the episode
    prompt_ids: list[int]
    response_ids: list[int]
    rollout_logprobs: list[float]
    advantage: float = 0.0  # filled in by compute_advantage
    reward: float = 0.0  # the episode's final reward, copied for logging
    policy_version: int = 0  # version of the weights that sampled response_ids
    truncated: bool = False  # the response hit max_new_tokens without EOS


@dataclass
class RolloutResult:
    """One episode: its Trajectory and its StepSamples (one per turn), plus where it came from."""

    trajectory: Trajectory
    step_samples: list[StepSample]
    policy_version: int = 0
    worker_id: int = -1  # -1 = the serial loop
    group_id: str = ""  # the (task, round) group this episode belongs to
    seat: int | None = None  # a game's player this episode played (rollout/games.py); None: a one-player episode
    opponent: str = ""  # what played the game's other seats: "self", "random" ("" for a one-player episode)

    @property
    def task_id(self) -> str:
        return self.trajectory.task_id

    @property
    def reward(self) -> float:
        return self.trajectory.final_reward

    @property
    def role(self) -> str:
        """The game and seat an episode played (`<game>/seat<k>`), what a role baseline is kept for; "" for a
        one-player episode. The game is the task's "game" field, else the env's one game."""
        return "" if self.seat is None else f"{self.trajectory.task.get('game', '')}/seat{self.seat}"

    @property
    def failed(self) -> bool:
        return self.trajectory.termination_reason in FAILED_REASONS

    @property
    def cut(self) -> bool:
        """Its last response hit max_new_tokens without EOS."""
        return bool(self.step_samples) and self.step_samples[-1].truncated

    @property
    def succeeded(self) -> bool:
        """The episode succeeded (`success`): what success_rate, pass@k and held-out success count."""
        return success(self.trajectory.steps, self.reward)

    @property
    def first_turn_succeeded(self) -> bool:
        """Its first turn succeeded, by the same rule on that turn alone."""
        steps = self.trajectory.steps
        return bool(steps) and success(steps[:1], steps[0].reward)


class Unplayed(NamedTuple):
    """A game's policy seat the game ended before it moved (the other seat broke the rules first): no episode, as
    nothing was said to train on, but a game played, which held-out evaluation counts (trainer/evaluate.py)."""

    seat: int
    reward: float  # the seat's final reward from the game
    task_id: str


@dataclass
class RolloutBatch:
    """One RolloutEngine.run call: its episodes (task order, then sample order) and its counters."""

    results: list[RolloutResult]
    timings: dict = field(default_factory=dict)  # rollout_s, generate_s, gen_tokens + the decode engine's counters
    unplayed: list[Unplayed] = field(default_factory=list)  # a game's policy seats the game ended before they moved
