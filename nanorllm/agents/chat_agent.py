"""ChatAgent: keeps the chat messages of one episode and records it into a Trajectory.

Every observation becomes a user message (the question, retry feedback, a tool's result); every
response an assistant message. It judges nothing (the env does) and knows nothing of tokens (the
policy does).
"""

from nanorllm.core.types import Step, Trajectory


def observation_text(observation) -> str:
    """An observation is text or {"question": text}."""
    return observation if isinstance(observation, str) else observation["question"]


class ChatAgent:
    def __init__(self, *, system_prompt: str | None = None, example: tuple[str, str] | list[dict] | None = None):
        self.system_prompt = system_prompt
        self.example = example  # (question, answer), or a list of chat messages for a longer exchange
        self.messages: list[dict] = []
        self.trajectory: Trajectory | None = None

    def reset(self, task: dict, observation) -> None:
        self.trajectory = Trajectory(task_id=task["task_id"], task=dict(task))
        self.messages = []
        if self.system_prompt:
            self.messages.append({"role": "system", "content": self.system_prompt})
        if isinstance(self.example, tuple):
            self.messages += [{"role": "user", "content": self.example[0]},
                              {"role": "assistant", "content": self.example[1]}]
        elif self.example:
            self.messages += [dict(m) for m in self.example]
        text = observation_text(observation)
        self.messages.append({"role": "user", "content": text})
        self.trajectory.steps.append(Step(observation=text))

    def update_from_model(self, response: str) -> None:
        self.messages.append({"role": "assistant", "content": response})
        self.trajectory.steps[-1].model_response = response

    def update_from_env(self, observation: str | None, reward: float, done: bool, info: dict) -> None:
        step = self.trajectory.steps[-1]
        step.reward, step.done, step.feedback, step.info = reward, done, observation, info
        step.action = info.get("action", info.get("extracted"))
        if not done and observation is not None:
            self.messages.append({"role": "user", "content": observation})
            self.trajectory.steps.append(Step(observation=observation))

    def finish(self, reward: float, *, terminated: bool, reason: str) -> Trajectory:
        traj = self.trajectory
        traj.final_reward, traj.terminated, traj.termination_reason = reward, terminated, reason
        return traj
