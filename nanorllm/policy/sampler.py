"""Temperature / top-p sampling from one uniform number per row, and where those numbers come from.

Sampling is inverse-CDF: row b takes the first token whose cumulative probability exceeds u[b]. The
token then depends only on the row's logits and its u, never on which rows share the batch.

Two sources of u, one per device kind:
- CPU: each row's own torch.Generator draws one number per token (`uniforms_from_generators`). It is
  the stream the engine has always used, so a fixed seed gives the tokens it always gave.
- CUDA: a counter-based hash of (row seed, token index) computed on the device (`counter_uniforms`):
  no host round trip, nothing to keep in step with, and it runs inside a captured CUDA graph. The row
  seed is the seed of the row's generator, itself drawn in episode order from the run's seed.
"""

import torch
import torch.nn.functional as F

from nanorllm.policy.base import SamplingParams

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (lowbias32's shape) in int64 arithmetic: 31-bit multipliers keep every
    product below 2**63, so nothing overflows on any device."""
    x = x & _M32
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & _M32
    x = ((x ^ (x >> 15)) * 0x5BD1E995) & _M32
    return x ^ (x >> 16)


def counter_uniforms(seeds: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(B,) float32 in (0, 1) from int64 (B,) row seeds and token indices: the same pair, the same number."""
    h = _mix32(index ^ _mix32(seeds ^ _mix32(seeds >> 32)))
    return ((h >> 8).float() + 0.5) / float(1 << 24)


def row_seed(rng: torch.Generator | None) -> int:
    """The counter-based sampler's seed for a row: its generator's seed (int64)."""
    return (rng.initial_seed() if rng is not None else 0) & ((1 << 63) - 1)


def uniforms_from_generators(rngs: list[torch.Generator], device: torch.device) -> torch.Tensor:
    """(B,) one draw from each row's own CPU generator."""
    return torch.cat([torch.rand(1, generator=g) for g in rngs]).to(device)


def sample_with_uniforms(logits: torch.Tensor, params: SamplingParams,
                         u: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) tokens and their logprobs under softmax(logits / temperature) over the full vocabulary,
    logits (B, V) float32; greedy ignores u and scores the argmax at temperature 1."""
    if params.greedy:
        tok = logits.argmax(-1)
        return tok, F.log_softmax(logits, -1).gather(-1, tok[:, None])[:, 0]
    logp = F.log_softmax(logits / params.temperature, -1)  # (B, V)
    probs = logp.exp()
    if params.top_p < 1.0:
        sorted_p, idx = probs.sort(-1, descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p > params.top_p  # keep the smallest head with mass >= top_p
        probs = probs.scatter(-1, idx, sorted_p.masked_fill(drop, 0.0))
    cdf = probs.cumsum(-1)  # (B, V)
    tok = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0].clamp(max=logits.shape[-1] - 1)
    return tok, logp.gather(-1, tok[:, None])[:, 0]
