"""MathAgent: keeps the chat messages of one episode and records it into a Trajectory.

It judges nothing (the env does) and knows nothing of tokens (the policy does).
"""

from nanorllm.core.types import Step, Trajectory

DEFAULT_SYSTEM_PROMPT = ("You are a careful math assistant. Solve the problem and give the final "
                         "answer as a number in \\boxed{}.")
# One worked example in the prompt teaches a small model the answer format.
DEFAULT_EXAMPLE = ("What is 2 + 5?", "2 + 5 = 7. The answer is \\boxed{7}.")


class MathAgent:
    def __init__(self, *, system_prompt: str = DEFAULT_SYSTEM_PROMPT,
                 example: tuple[str, str] | None = DEFAULT_EXAMPLE):
        self.system_prompt = system_prompt
        self.example = example
        self.messages: list[dict] = []
        self.trajectory: Trajectory | None = None

    def reset(self, task: dict, observation: dict) -> None:
        self.trajectory = Trajectory(task_id=task["task_id"], task=dict(task))
        self.messages = []
        if self.system_prompt:
            self.messages.append({"role": "system", "content": self.system_prompt})
        if self.example:
            self.messages += [{"role": "user", "content": self.example[0]},
                              {"role": "assistant", "content": self.example[1]}]
        self.messages.append({"role": "user", "content": observation["question"]})
        self.trajectory.steps.append(Step(observation=observation["question"]))

    def update_from_model(self, response: str) -> None:
        self.messages.append({"role": "assistant", "content": response})
        self.trajectory.steps[-1].model_response = response

    def update_from_env(self, feedback: str | None, reward: float, done: bool, info: dict) -> None:
        step = self.trajectory.steps[-1]
        step.reward, step.done, step.feedback, step.info = reward, done, feedback, info
        step.action = info.get("extracted")
        if not done and feedback is not None:
            self.messages.append({"role": "user", "content": feedback})
            self.trajectory.steps.append(Step(observation=feedback))

    def finish(self, reward: float, *, terminated: bool, reason: str) -> Trajectory:
        traj = self.trajectory
        traj.final_reward, traj.terminated, traj.termination_reason = reward, terminated, reason
        return traj
