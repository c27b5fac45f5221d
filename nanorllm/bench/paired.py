"""The settings of a benchmark that runs the same episodes two ways on one policy, side by side (agents, adapters)."""

from dataclasses import dataclass


@dataclass
class PairedConfig:
    model: str = "smollm2-135m-instruct"
    """Model (tiny-random for a smoke run)."""
    episodes: int = 32
    """Episodes run at once (one per task), in each of the two runs."""
    max_new_tokens: int = 32
    """Longest response per turn."""
    temperature: float = 0.7
    """Sampling temperature, as in training."""
    seed: int = 0
    """Seed of the episodes' random streams (the same for both runs)."""
    repeats: int = 3
    """Runs of each, alternating; each figure is from the fastest (the least disturbed by other load)."""
    threads: int | None = 1
    """Torch threads (None: every core). One: on a shared 2-core machine two threads thrash."""
    json: str | None = None
    """Also write the figures here."""
