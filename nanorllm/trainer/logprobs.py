"""Token logprobs and entropy read from (N, V) logits a block of rows at a time, never a full fp32 (N, V) copy.

The textbook loss takes log_softmax(logits.float()) over all N scored tokens, then the entropy's exp and product:
autograd keeps two or three fp32 (N, V) tensors alive until the backward, 12 bytes x vocabulary per token on top
of the logits themselves (bf16 under bf16), the largest share of the learner's activations for a big vocabulary.
Here the fp32 work runs on `rows_per_block(V)` rows at a time (a budget of BLOCK_ELEMENTS values) and is freed
at once; the forward keeps the logits and the (N,) entropies, and the backward recomputes each block's
log-softmax and writes its gradient over it from the closed form (onehot - p for the target logprob,
-p (log p + H) for the entropy), two block-sized fp32 tensors at a time, as Liger's fused cross-entropy and
prime-rl's chunked head do. Each row's values are the same operations as the textbook's on the same numbers, so
the logprobs and entropies are the same bits; the gradients differ in fp32 rounding. A teacher's exact reverse
KL is summed over the same blocks, under no grad.
"""

import torch
import torch.nn.functional as F

BLOCK_ELEMENTS = 2**24  # fp32 values per block of the log-softmax: 64 MiB, whatever the vocabulary


def rows_per_block(vocab: int) -> int:
    """How many rows of a (N, vocab) tensor one block's fp32 work takes."""
    return max(1, BLOCK_ELEMENTS // max(vocab, 1))


def blocks(n: int, vocab: int) -> list[slice]:
    """The row slices of an (n, vocab) tensor, in order."""
    step = rows_per_block(vocab)
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def log_distribution(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(R, V) logits -> (R, V) fp32 log-softmax(logits / T): one block's."""
    return F.log_softmax(logits.float() / temperature, dim=-1)


def target_and_entropy(logp: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, V) log-distributions -> (logprob of target (R,), entropy (R,))."""
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, targets[:, None])[:, 0], entropy


class BlockedTokenLogprobs(torch.autograd.Function):
    """(N, V) logits, (N,) targets -> (N,) target logprobs, (N,) entropies; saves the logits alone."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, temperature: float):
        n = logits.shape[0]
        lp = logits.new_empty(n, dtype=torch.float32)
        entropy = logits.new_empty(n, dtype=torch.float32)
        for rows in blocks(n, logits.shape[-1]):
            lp[rows], entropy[rows] = target_and_entropy(log_distribution(logits[rows], temperature), targets[rows])
        ctx.save_for_backward(logits, targets, entropy)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)
        return lp, entropy

    @staticmethod
    def backward(ctx, grad_lp: torch.Tensor | None, grad_entropy: torch.Tensor | None):
        logits, targets, entropy = ctx.saved_tensors
        if grad_lp is None and grad_entropy is None:
            return None, None, None
        grad = torch.empty_like(logits)
        for rows in blocks(logits.shape[0], logits.shape[-1]):
            grad[rows] = block_gradient(log_distribution(logits[rows], ctx.temperature), targets[rows], entropy[rows],
                                        None if grad_lp is None else grad_lp[rows],
                                        None if grad_entropy is None else grad_entropy[rows]).div_(ctx.temperature)
        return grad, None, None


def block_gradient(logp: torch.Tensor, targets: torch.Tensor, entropy: torch.Tensor, grad_lp: torch.Tensor | None,
                   grad_entropy: torch.Tensor | None) -> torch.Tensor:
    """d(loss)/d(logits / T) of one block, written over `logp` in place: with p = exp(logp) and H the entropy,
    d lp_target / dz = onehot - p and dH / dz = -p (logp + H)."""
    p = logp.exp()
    if grad_entropy is not None:
        grad = logp.add_(entropy[:, None]).mul_(p).mul_(-grad_entropy[:, None])  # (R, V)
    else:
        grad = logp.zero_()
    if grad_lp is not None:
        grad.sub_(p.mul_(grad_lp[:, None]))
        grad.scatter_add_(1, targets[:, None], grad_lp[:, None].to(grad.dtype))
    return grad


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor,
                   temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, V) logits -> (logprob of target (N,), entropy (N,)) under softmax(logits / T), both fp32, a block of
    rows at a time: nothing of size (N, V) is made or kept but the logits' gradient."""
    return BlockedTokenLogprobs.apply(logits, targets, temperature)


@torch.no_grad()
def reverse_kl(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """(N,) the exact KL(student || teacher) over the vocabularies' common ids (a padded head's extra rows left
    out) of two (N, V) logits at temperature T, a block of rows at a time."""
    v = min(student.shape[-1], teacher.shape[-1])
    out = student.new_empty(student.shape[0], dtype=torch.float32)
    for rows in blocks(student.shape[0], max(student.shape[-1], teacher.shape[-1])):
        s = log_distribution(student[rows], temperature)[:, :v]
        t = log_distribution(teacher[rows], temperature)[:, :v]
        out[rows] = (s.exp() * (s - t)).sum(-1)
    return out
