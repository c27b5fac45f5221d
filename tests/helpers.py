"""Test doubles, and the wait for an event, shared by several test files."""

import re
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nanorllm.config.fields import Objective
from nanorllm.core.types import RolloutResult, Step, Trajectory
from nanorllm.policy.base import Generation, Policy, SamplingParams

WAIT_S = 60.0  # a net under an event that never comes, not a guess at how soon it comes


def wait_until(happened, timeout_s: float = WAIT_S) -> bool:
    """Whether `happened()` became true, asked every 10 ms; False only once `timeout_s` passed without it."""
    deadline = time.monotonic() + timeout_s
    while not happened():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class ScriptedPolicy(Policy):
    """A local-looking policy (token ids and logprobs) that replays scripted texts.

    `script[k]` is the list of responses for the k-th generate call, one per conversation in
    order; an entry is a str or a (str, truncated) pair. A callable script gets
    (call_index, row_index, messages) and returns the same kind of entry.
    Token ids are fake: every character is token 1 and has logprob -0.5.
    """


    def __init__(self, script, *, truncated: bool = False):
        self.script = script
        self.truncated = truncated
        self.batch_sizes: list[int] = []
        self.prompts: list[list[list[int]]] = []
        self.seeds: list[int] = []

    def seed(self, seed: int) -> None:
        self.seeds.append(seed)

    def first_prompt_ids(self, messages, tools=None):
        return [3] * len(messages)

    def next_prompt_ids(self, prompt_ids, response_ids, new_messages, tools=None):
        return prompt_ids + response_ids + [4, 4]

    def _entry(self, call, row, messages):
        entry = self.script(call, row, messages) if callable(self.script) else self.script[call][row]
        return entry if isinstance(entry, tuple) else (entry, self.truncated)

    def generate(self, conversations, prompt_ids, params: SamplingParams):
        call = len(self.batch_sizes)
        self.batch_sizes.append(len(conversations))
        self.prompts.append([list(p) for p in prompt_ids])
        gens = []
        for row, messages in enumerate(conversations):
            text, truncated = self._entry(call, row, messages)
            gens.append(Generation(text=text, response_ids=[1] * len(text), logprobs=[-0.5] * len(text),
                                   truncated=truncated))
        return gens


class HostReads(TorchDispatchMode):
    """Counts the aten ops that make the host wait for a device value (on a GPU, a synchronisation):
    a scalar read (item, int, float, bool all call `_local_scalar_dense`), an op whose output shape
    depends on the data (nonzero, masked_select, unique, boolean-mask indexing and its backward's
    index_put), and whole-tensor comparisons. It sees every op dispatched while it is active,
    whether our code or transformers' calls it; on CPU it cannot tell a host tensor's read from a
    device's, so the step must read no tensor at all."""

    READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
             torch.ops.aten.equal.default, torch.ops.aten.is_nonzero.default, torch.ops.aten.masked_select.default,
             torch.ops.aten._unique2.default, torch.ops.aten.unique_dim.default,
             torch.ops.aten.unique_consecutive.default}
    INDEXING = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default,
                torch.ops.aten._index_put_impl_.default}

    def __init__(self, also: frozenset = frozenset()):
        super().__init__()
        self.also = also  # more ops to count as reads (e.g. lift_fresh: a tensor built from host data)
        self.seen: list[str] = []
        self.ops = 0  # every op dispatched: that the mode saw the code at all

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        if func in self.READS or func in self.also or (func in self.INDEXING and any(
                i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1])):
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def doc_example(doc: Path, heading: str, target: Path, *, max_lines: int) -> Path:
    """The first python block after `heading` in a docs page, saved at `target` as a user would save it."""
    section = doc.read_text().split(heading, 1)[1]
    code = re.search(r"```python\n(.*?)\n```\n", section, re.S).group(1)
    assert len(code.splitlines()) <= max_lines
    target.write_text(code + "\n")
    return target


def episode(task_id: str, answer: str | None, reward: float = 0.5, *, response: str = "", info: dict | None = None,
            reason: str = "max_turns") -> RolloutResult:
    """A one-turn episode as the engine would return it (no samples): its graded `answer`, reward and step info."""
    step = Step(observation="q", model_response=response, action=answer, reward=reward, done=True, info=info or {})
    return RolloutResult(Trajectory(task_id=task_id, steps=[step], final_reward=reward, terminated=True,
                                    termination_reason=reason), step_samples=[])


def loss_settings(**fields) -> Objective:
    """The loss's settings with `fields` over the groups' defaults, at temperature 1 (logprobs as log_softmax gives
    them) and a Dr. GRPO constant of one token."""
    return Objective(**{"temperature": 1.0, "max_new_tokens": 1, **fields})
