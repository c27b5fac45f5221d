"""The loss at the head, textbook vs blocked (trainer/logprobs.py): the peak memory and seconds of the token
logprobs' and entropy's forward and backward over (N, V) logits, each in a fresh process (its own peak RSS).

    python -m nanorllm.bench.head_loss [--tokens 2048] [--vocab 49152]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from nanorllm.bench.rss import peak_rss_bytes
from nanorllm.bench.spawned import spawned_answer
from nanorllm.trainer.logprobs import token_logprobs

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def textbook(logits: torch.Tensor, targets: torch.Tensor, temperature: float):
    """The full fp32 log-softmax, as the loss read it before the blocked one."""
    logp = F.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets[:, None])[:, 0], -(logp.exp() * logp).sum(-1)


LOSSES = {"textbook": textbook, "blocked": token_logprobs}


def measure(loss: str, dtype: str, tokens: int, vocab: int, rounds: int, out) -> None:
    """In a fresh process: the peak RSS above the logits' own, and the median seconds, of `rounds` forward and
    backward passes of `loss`."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(tokens, vocab, generator=g, dtype=DTYPES[dtype]).mul_(3).requires_grad_(True)  # no temporary
    targets, weights = torch.randint(0, vocab, (tokens,), generator=g), torch.randn(tokens, generator=g)
    logits.grad = torch.zeros_like(logits)  # the gradient's buffer counted as held before, as the update holds it
    base = peak_rss_bytes()
    seconds = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        lp, entropy = LOSSES[loss](logits, targets, 1.0)
        ((weights * lp).sum() + 0.01 * entropy.sum()).backward()
        seconds.append(time.perf_counter() - t0)
    out.put({"peak_mib": (peak_rss_bytes() - base) / 2**20, "seconds": statistics.median(seconds)})


def figures(tokens: int, vocab: int, rounds: int = 3) -> dict[str, dict]:
    """{"<loss> <dtype>": {"peak_mib", "seconds"}} for both losses at both dtypes."""
    return {f"{loss} {dtype}": spawned_answer(measure, [(loss, dtype, tokens, vocab, rounds)], join_s=60.0)
            for dtype in DTYPES for loss in LOSSES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048, help="scored tokens N")
    parser.add_argument("--vocab", type=int, default=49152, help="vocabulary V (SmolLM2's by default)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"head loss over ({args.tokens}, {args.vocab}) logits, forward + backward, 1 thread, median of {args.rounds}")
    for name, f in figures(args.tokens, args.vocab, args.rounds).items():
        print(f"  {name:14s} peak +{f['peak_mib']:7.1f} MiB above logits and gradient, {f['seconds']:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
