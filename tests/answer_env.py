"""An env whose final answer a test chooses, to train on it: with `--env-arg answer=42` every episode's graded
answer is 42 (a policy collapsed to a constant), with `answer=1|2` one of those two, by the response's characters
(a policy of two guesses whatever the question), with the default '' it records none and the final answer is the
response itself (the tiny random model's differ). Every episode ends at its first turn with reward 0.5."""

from nanorllm.envs.math_env import MathSelfRefine


class AnswerEnv:
    def __init__(self, *, max_turns: int, answer: str = ""):
        self.answer = answer

    def reset(self, task: dict) -> str:
        return task["question"]

    def step(self, response: str) -> tuple[None, float, bool, dict]:
        guesses = self.answer.split("|")
        return None, 0.5, True, {"action": guesses[sum(map(ord, response)) % len(guesses)] or None}


class Answers(MathSelfRefine):
    """The math env's tasks and prompt; `AnswerEnv`'s grading."""

    name = "answers"
    env_class = AnswerEnv
    args = {"answer": ""}

    def make_env(self) -> AnswerEnv:
        return AnswerEnv(max_turns=self.settings.max_turns, **self.options)
