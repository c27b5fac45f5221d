"""MathEnv: the self-refine environment. One question, up to `max_turns` answers.

Rules (from the design notes, exactly):
- correct answer in \\boxed{} -> done, reward 1.0
- wrong, turns left            -> not done, reward 0.0, retry feedback
- wrong on the last turn       -> done, reward 0.0
The reward is terminal: only the last step's reward is the episode's reward.
`MathSelfRefine` is the bundle `--env math` names (the default).
"""

from typing import Callable

from nanorllm.agents.math_agent import DEFAULT_EXAMPLE, DEFAULT_SYSTEM_PROMPT, MathAgent
from nanorllm.core.limits import GRADER_TIMEOUT_S
from nanorllm.envs.base import EnvBundle
from nanorllm.envs.grader import judge

# The default task (docs/results.md): sums and differences of two numbers 0-20, 882 distinct problems;
# the 200 held out are drawn by another seed and removed from training.
DEFAULT_TASKS = "arith:max=20,terms=2,ops=+-,count=882,seed=1"
DEFAULT_EVAL_TASKS = "arith:max=20,terms=2,ops=+-,count=200,seed=2"
RETRY_FEEDBACK = ("Your answer is incorrect. Check your work and try again. "
                  "Put your final answer in \\boxed{}.")
NO_BOX_FEEDBACK = ("I could not find a final answer. Solve it again and put your final answer "
                   "in \\boxed{}.")


class MathEnv:
    def __init__(self, *, max_turns: int = 2, grader_timeout_s: float = GRADER_TIMEOUT_S,
                 progress: Callable[[], None] | None = None):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns
        self.grader_timeout_s = grader_timeout_s
        self.progress = progress  # called while a symbolic answer check runs (a heartbeat)
        self.task: dict | None = None
        self.turn = 0

    def reset(self, task: dict) -> dict:
        self.task, self.turn = task, 0
        return {"question": task["question"]}

    def step(self, response: str) -> tuple[str | None, float, bool, dict]:
        """Grade one response. Returns (feedback or None, reward, done, info)."""
        assert self.task is not None, "call reset(task) first"
        self.turn += 1
        verdict = judge(response, self.task["answer"], cpu_limit_s=self.grader_timeout_s, progress=self.progress)
        correct = verdict.correct
        info = {"extracted": verdict.extracted, "correct": correct, "turn": self.turn}
        if verdict.timed_out:
            info["grader_timeout"] = True
        if correct:
            return None, 1.0, True, info
        if self.turn >= self.max_turns:
            return None, 0.0, True, info
        return (RETRY_FEEDBACK if verdict.extracted is not None else NO_BOX_FEEDBACK), 0.0, False, info


class MathSelfRefine(EnvBundle):
    """Math questions, answered in \\boxed{}, with retry feedback until max_turns."""

    name = "math"
    agent_class = MathAgent
    system_prompt = DEFAULT_SYSTEM_PROMPT
    example = DEFAULT_EXAMPLE
    default_tasks, default_eval_tasks = DEFAULT_TASKS, DEFAULT_EVAL_TASKS

    def make_env(self) -> MathEnv:
        return MathEnv(max_turns=self.settings.max_turns, grader_timeout_s=self.settings.grader_timeout_s)

    def demonstrations(self, task: dict) -> list[dict]:
        """The gold answer, boxed, as the worked example writes it."""
        return [{"role": "assistant", "content": f"The answer is \\boxed{{{task['answer']}}}."}]
