"""A verifiers (0.4.0) environment written the way its users write one, for tests/test_verifiers_env.py and the
docs: a taskset over an in-memory `datasets.Dataset` (prompt, answer, info), scored by local rewards.

- `load_environment()`: one turn (verifiers' SingleAgentEnv), rewarded 1.0 when the reply holds the answer.
- `load_guessing(max_guesses=2)`: several turns: the env plays the user, answering "higher" or "lower" until the
  reply holds the answer or the guesses are spent (an Env's `run` over `interaction.turn`, as verifiers'
  TextArena env is written).
- `load_raising()`, `load_nan()`: a reward that raises on some tasks, one that returns NaN on some;
  `load_parity()`: a reward the tiny random model earns about half the time (so its groups carry signal);
  `load_installing()`: a reward that shells out to install a package (1.0 when the installer would stay offline).
- `load_promptless()`: tasks with no prompt, the user (the env) opening the conversation, as verifiers'
  `alphabet_sort` does.
"""

import asyncio
import subprocess
import sys
import datasets
import verifiers.v1 as vf

PAIRS = [(a, b) for a in range(1, 6) for b in range(1, 5)]  # 20 sums


def dataset() -> datasets.Dataset:
    return datasets.Dataset.from_list([{"prompt": f"What is {a} + {b}? Reply with the number only.",
                                        "answer": str(a + b), "info": {"a": a, "b": b}} for a, b in PAIRS])


class SumData(vf.TaskData):
    answer: str
    info: dict


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        return float(task.answer in trace.last_reply)

    @vf.metric
    async def reply_chars(self, trace) -> float:
        return float(len(trace.last_reply))


class SumConfig(vf.TasksetConfig):
    size: int = len(PAIRS)  # the first `size` rows
    promptless: bool = False  # tasks without a prompt: the env's user opens the conversation


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self):
        for row in dataset().select(range(self.config.size)):
            yield SumTask(SumData(prompt=None if self.config.promptless else row["prompt"], answer=row["answer"],
                                  info=row["info"],
                                  system_prompt="You are a careful calculator."), self.config.task)


def load_environment(size: int = len(PAIRS)) -> vf.Env:
    return vf.SingleAgentEnv(vf.SingleAgentEnvConfig(taskset={"id": "verifiers_example", "size": size}))


class GuessConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()
    max_guesses: int = 2


class GuessEnv(vf.Env[GuessConfig]):
    """The env is the user: each reply without the answer gets a hint and another turn."""

    async def run(self, task, agents) -> None:
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            for _ in range(self.config.max_guesses - 1):
                if segment.terminated or task.data.answer in segment.last_reply:
                    break
                segment = await interaction.turn("No. Try again: reply with the number only.")


class OpeningEnv(vf.Env[GuessConfig]):
    """The env is the user and speaks first: the task has no prompt of its own."""

    async def run(self, task, agents) -> None:
        async with agents.player.interaction(task) as interaction:
            await interaction.turn(f"What is {task.data.info['a']} + {task.data.info['b']}? Reply with the number.")


def load_promptless() -> vf.Env:
    return OpeningEnv(GuessConfig(taskset={"id": "verifiers_example", "promptless": True}))


def load_guessing(max_guesses: int = 2) -> vf.Env:
    return GuessEnv(GuessConfig(taskset={"id": "verifiers_example"}, max_guesses=max_guesses))


async def raising_reward(task, trace) -> float:
    if task.info["a"] % 2:
        raise ValueError("the grader is down")
    return 1.0


async def nan_reward(task, trace) -> float:
    return float("nan") if task.info["a"] % 2 else 1.0


async def parity_reward(task, trace) -> float:
    """A rule the tiny random model meets about half the time (tests/runs.py `length_rule`)."""
    return float(sum(map(ord, trace.last_reply)) % 2 == 0)


async def slow_reward(task, trace) -> float:
    """Odd tasks take 30 s to grade: past a short --agent-timeout-s."""
    if task.info["a"] % 2:
        await asyncio.sleep(30)
    return 1.0


async def installing_reward(task, trace) -> float:
    """Shells out as a reward that installs what it needs with `uv` or pip would: 1.0 when the process it starts
    would find both offline (UV_OFFLINE, PIP_NO_INDEX)."""
    seen = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('UV_OFFLINE'), "
                           "os.environ.get('PIP_NO_INDEX'))"], capture_output=True, text=True, check=True).stdout
    return float(seen.split() == ["1", "1"])


def _plugged(reward: str) -> vf.Env:
    """The sum env with its `correct` reward replaced by `reward` (verifiers' plugged reward functions)."""
    return vf.SingleAgentEnv(vf.SingleAgentEnvConfig(taskset={
        "id": "verifiers_example", "task": {"rewards": {"correct": {"fn": f"verifiers_example:{reward}"}}}}))


def load_raising() -> vf.Env:
    return _plugged("raising_reward")


def load_nan() -> vf.Env:
    return _plugged("nan_reward")


def load_parity() -> vf.Env:
    return _plugged("parity_reward")


def load_installing() -> vf.Env:
    return _plugged("installing_reward")


def load_slow() -> vf.Env:
    return _plugged("slow_reward")


def not_an_env():
    return {"prompt": "hi"}


def loader_that_raises():
    raise RuntimeError("no such dataset")


def loader_that_exits():
    import sys

    sys.exit(3)  # as a loader that parses the command line does


__all__ = ["SumTaskset"]
