"""What the RolloutEngine needs from a policy, whether a local model or a hosted API.

A local model works on token ids: each episode's prompt is a token stream that every later turn
extends, so the learner can score all turns of an episode with one forward pass. An API model
sees only chat messages and returns text; it has no token ids or logprobs and cannot be trained.
The engine asks for both views and each policy uses the one it has.

A local model may also offer `decode_batch(params)` (see bench/decode_batch.py): rows that join and
leave a running batch between decode steps. The engine uses it when it is there and falls back to
one `generate` call per turn otherwise.
"""

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    ignore_eos: bool = False  # every response runs to max_new_tokens and counts as finished, not truncated (benchmarks)

    def __post_init__(self):
        # temperature 0 would divide the logits by zero and sample garbage without a word: greedy says it
        if not self.greedy and not self.temperature > 0:
            raise ValueError(f"SamplingParams: temperature must be > 0, got {self.temperature} (greedy=True decodes greedily)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams: top_p must be in (0, 1], got {self.top_p}")


@dataclass
class Generation:
    """One sampled response."""

    text: str
    response_ids: list[int] = field(default_factory=list)  # empty for API models
    logprobs: list[float] = field(default_factory=list)  # one per response id
    truncated: bool = False  # stopped by max_new_tokens, not by end-of-turn


class Policy:
    """Interface. Local policies return token ids and logprobs; API policies text only."""

    version: int = 0

    def seed(self, seed: int) -> None:
        """Seed the sampler (a no-op where sampling happens elsewhere)."""

    def first_prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """Token ids of the opening prompt (chat template + generation prompt). [] for API models."""
        return []

    def next_prompt_ids(self, prompt_ids: list[int], response_ids: list[int], new_messages: dict | list[dict],
                        tools: list[dict] | None = None) -> list[int]:
        """Extend last turn's prompt + response with the new messages (a user message, tool results) and the
        generation prompt."""
        return []

    def generate(self, conversations: list[list[dict]], prompt_ids: list[list[int]],
                 params: SamplingParams) -> list[Generation]:
        """Sample one response for each conversation, all in one batch."""
        raise NotImplementedError
