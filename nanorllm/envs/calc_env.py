"""CalcEnv: answer an arithmetic question with a calculator tool at hand (`--env calc`).

A turn is either a tool call or a final answer, whichever comes first in the response:
- a fenced calc block, ```calc\\n37 * 52 - 64\\n``` (closed or cut off at the end): the expression
  goes to the calculator (envs/calculator.py) and its result, "Result: 1860", or its error, is the
  next observation; reward 0, not done (done at the turn limit);
- a \\boxed{} answer: done, reward 1.0 if it equals the gold answer (grader.judge), else 0.0;
- neither: a reminder of the two forms, not done (done at the turn limit).
Each step's info carries "tool_call" (the expression, or None) and "tool_error" (bool), which
`CalculatorTool.metrics` turns into scalars.
"""

import re

from nanorllm.core.limits import GRADER_TIMEOUT_S
from nanorllm.core.types import RolloutResult
from nanorllm.datasets.calc_tasks import make_calc_tasks, parse_calc_spec
from nanorllm.envs.base import EnvBundle
from nanorllm.envs.calculator import CalcError, calculate
from nanorllm.envs.grader import judge

CALL = re.compile(r"```calc[ \t]*\n?(.*?)(?:```|$)", re.S)
SYSTEM_PROMPT = ("You are a careful math assistant with a calculator. To calculate, write one arithmetic "
                 "expression in a calc block, like ```calc\n12 * 34 + 5\n```, and stop: the calculator "
                 "answers. Then give the final answer as a number in \\boxed{}.")
EXAMPLE = [{"role": "user", "content": "What is 12 * 34 + 5?"},
           {"role": "assistant", "content": "```calc\n12 * 34 + 5\n```"},
           {"role": "user", "content": "Result: 413"},
           {"role": "assistant", "content": "The answer is \\boxed{413}."}]
NO_ANSWER = ("Write a calculation in a ```calc``` block, or give the final answer as a number in \\boxed{}.")


class CalcEnv:
    def __init__(self, *, max_turns: int = 3, max_chars: int = 100, grader_timeout_s: float = GRADER_TIMEOUT_S):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns, self.max_chars, self.grader_timeout_s = max_turns, max_chars, grader_timeout_s
        self.task: dict | None = None
        self.turn = 0

    def reset(self, task: dict) -> str:
        self.task, self.turn = task, 0
        return task["question"]

    def step(self, response: str) -> tuple[str | None, float, bool, dict]:
        assert self.task is not None, "call reset(task) first"
        self.turn += 1
        last = self.turn >= self.max_turns
        call, box = CALL.search(response), response.find("\\boxed")
        if call and (box < 0 or call.start() < box):
            expression = call.group(1).strip()
            info = {"tool_call": expression, "tool_error": False, "turn": self.turn}
            try:
                observation = f"Result: {calculate(expression, max_chars=self.max_chars)}"
            except CalcError as e:
                observation, info["tool_error"] = f"Calculator error: {e}.", True
            return (None, 0.0, True, {**info, "reason": "max_turns"}) if last else (observation, 0.0, False, info)
        if box >= 0:
            verdict = judge(response, self.task["answer"], cpu_limit_s=self.grader_timeout_s)
            return None, float(verdict.correct), True, {
                "action": verdict.extracted, "correct": verdict.correct, "tool_call": None, "turn": self.turn,
                "reason": "correct" if verdict.correct else "wrong"}
        info = {"tool_call": None, "turn": self.turn}
        return (None, 0.0, True, {**info, "reason": "max_turns"}) if last else (NO_ANSWER, 0.0, False, info)


def tool_calls(result: RolloutResult) -> int:
    return sum(s.info.get("tool_call") is not None for s in result.trajectory.steps)


class CalculatorTool(EnvBundle):
    """Two-digit multi-step arithmetic with a calculator tool; reward 1 for a correct final answer."""

    name = "calc"
    env_class = CalcEnv
    system_prompt = SYSTEM_PROMPT
    example = EXAMPLE
    args = {"max_chars": 100}  # longest expression the calculator reads
    default_tasks, default_eval_tasks = "calc:count=2000,seed=1", "calc:count=200,seed=2"

    def make_env(self) -> CalcEnv:
        return CalcEnv(max_turns=self.settings.max_turns, grader_timeout_s=self.settings.grader_timeout_s,
                       **self.options)

    def load_tasks(self, spec: str, *, limit: int | None = None) -> list[dict]:
        if spec == "calc" or spec.startswith("calc:"):
            params = parse_calc_spec(spec)
            if limit is not None:
                params["count"] = min(params["count"], limit)
            return make_calc_tasks(**params)
        return super().load_tasks(spec, limit=limit)  # a JSONL file of questions and numeric answers

    def metrics(self, results: list[RolloutResult]) -> dict:
        """Tool calls and errors per episode; success of episodes that called the tool and of those that did not."""
        n = max(len(results), 1)
        calls = [tool_calls(r) for r in results]
        m = {"tool/calls_per_episode": sum(calls) / n,
             "tool/errors_per_episode": sum(bool(s.info.get("tool_error")) for r in results
                                            for s in r.trajectory.steps) / n,
             "tool/episodes_with_call": sum(c > 0 for c in calls) / n}
        with_call = [r.succeeded for r, c in zip(results, calls) if c]
        without = [r.succeeded for r, c in zip(results, calls) if not c]
        if with_call:
            m["tool/success_with_call"] = sum(with_call) / len(with_call)
        if without:
            m["tool/success_without_call"] = sum(without) / len(without)
        return m
