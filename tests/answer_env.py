"""An env whose final answer a test chooses, to train on it: with `--env-arg answer=42` every episode's graded
answer is 42 (a policy collapsed to a constant), with the default '' it records none and the final answer is the
response itself (the tiny random model's differ). Every episode ends at its first turn with reward 0.5."""

from nanorllm.envs.math_env import MathSelfRefine


class AnswerEnv:
    def __init__(self, *, max_turns: int, answer: str = ""):
        self.answer = answer

    def reset(self, task: dict) -> str:
        return task["question"]

    def step(self, response: str) -> tuple[None, float, bool, dict]:
        return None, 0.5, True, {"action": self.answer or None}


class Answers(MathSelfRefine):
    """The math env's tasks and prompt; `AnswerEnv`'s grading."""

    name = "answers"
    env_class = AnswerEnv
    args = {"answer": ""}

    def make_env(self) -> AnswerEnv:
        return AnswerEnv(max_turns=self.settings.max_turns, **self.options)
