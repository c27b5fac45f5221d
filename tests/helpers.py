"""Test doubles shared by several test files."""

from nanorllm.policy.base import Generation, Policy, SamplingParams


class ScriptedPolicy(Policy):
    """A trainable-looking policy that replays scripted texts.

    `script[k]` is the list of responses for the k-th generate call, one per conversation in
    order; an entry is a str or a (str, truncated) pair. A callable script gets
    (call_index, row_index, messages) and returns the same kind of entry.
    Token ids are fake: every character is token 1 and has logprob -0.5.
    """

    trainable = True

    def __init__(self, script, *, truncated: bool = False):
        self.script = script
        self.truncated = truncated
        self.batch_sizes: list[int] = []
        self.prompts: list[list[list[int]]] = []
        self.seeds: list[int] = []

    def seed(self, seed: int) -> None:
        self.seeds.append(seed)

    def first_prompt_ids(self, messages):
        return [3] * len(messages)

    def next_prompt_ids(self, prompt_ids, response_ids, new_message):
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
