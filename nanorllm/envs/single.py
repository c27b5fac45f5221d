"""`--env single`: one response, no feedback, no reward of its own. The run's reward sources (rewards/functions.py)
score it: chosen when --reward, --reward-model or --judge is given without --env, so a prompt-only or
conversational dataset (TRL's format) trains on the sources' values alone."""

from nanorllm.agents.chat_agent import observation_text
from nanorllm.agents.math_agent import MathAgent
from nanorllm.core.types import Step, Trajectory
from nanorllm.envs.math_env import MathSelfRefine


class SingleTurnEnv:
    """One response, no feedback, no reward of its own: the reward functions score it."""

    def __init__(self, *, max_turns: int = 1):
        self.task: dict | None = None

    def reset(self, task: dict) -> dict:
        """The question; for a conversational prompt its last message's text (the agent renders them all)."""
        self.task = task
        question = task["question"]
        return {"question": question[-1]["content"] if isinstance(question, list) else question}

    def step(self, response: str) -> tuple[None, float, bool, dict]:
        return None, 0.0, True, {}


class PromptAgent(MathAgent):
    """The math agent, but a conversational prompt (a task whose question is a list of chat messages, as TRL's
    conversational datasets hold it) is the conversation as it stands, system turn included: no system prompt
    or worked example of ours is added."""

    def reset(self, task: dict, observation) -> None:
        question = task.get("question")
        if not isinstance(question, list):
            return super().reset(task, observation)
        self.trajectory = Trajectory(task_id=task["task_id"], task=dict(task))
        self.messages = [dict(m) for m in question]
        self.trajectory.steps.append(Step(observation=observation_text(observation)))


class SingleTurn(MathSelfRefine):
    """The math prompt and tasks, one turn, scored only by --reward functions (`--env single`). Its tasks need
    no gold answer (a prompt-only dataset: the functions score), and a question may be a list of chat
    messages (a conversational dataset, TRL's format)."""

    name = "single"
    env_class = SingleTurnEnv
    agent_class = PromptAgent

    def make_env(self) -> SingleTurnEnv:
        return SingleTurnEnv()

    def load_tasks(self, spec: str, *, limit: int | None = None) -> list[dict]:
        from nanorllm.datasets.tasks import load_tasks

        return load_tasks(spec, limit=limit, fields=self.settings.task_fields, gold=False, chat=True)

