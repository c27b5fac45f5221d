"""The blocked log-softmax (trainer/logprobs.py) against the textbook one on random logits: the same values and
gradients (fp32 values to the bit, gradients and bf16 within rounding), across block edges, and no fp32 (N, V)
tensor kept."""

import pytest
import torch
import torch.nn.functional as F

from nanorllm.trainer import logprobs
from nanorllm.trainer.logprobs import reverse_kl, token_logprobs


def textbook(logits: torch.Tensor, targets: torch.Tensor, temperature: float):
    logp = F.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets[:, None])[:, 0], -(logp.exp() * logp).sum(-1)


def random_case(n: int, vocab: int, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(n, vocab, generator=g)).to(dtype)
    return logits, torch.randint(0, vocab, (n,), generator=g), torch.randn(n, generator=g), torch.randn(n, generator=g)


def grads(fn, logits, targets, temperature, w_lp, w_ent):
    x = logits.clone().requires_grad_(True)
    lp, ent = fn(x, targets, temperature)
    ((w_lp * lp).sum() + (w_ent * ent).sum()).backward()
    return lp.detach(), ent.detach(), x.grad


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 3 rows of a vocabulary of 50, so 10 rows cross several block edges and end on a partial one."""
    monkeypatch.setattr(logprobs, "BLOCK_ELEMENTS", 150)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_blocked_logprobs_and_entropy_are_the_textbooks_bits_in_fp32_and_gradients_its_rounding(small_blocks,
                                                                                                 temperature):
    logits, targets, w_lp, w_ent = random_case(10, 50)
    assert logprobs.rows_per_block(50) == 3
    lp, ent, grad = grads(token_logprobs, logits, targets, temperature, w_lp, w_ent)
    lp_, ent_, grad_ = grads(textbook, logits, targets, temperature, w_lp, w_ent)
    assert torch.equal(lp, lp_) and torch.equal(ent, ent_)
    torch.testing.assert_close(grad, grad_, rtol=1e-5, atol=1e-7)


def test_blocked_logprobs_of_bf16_logits_match_the_textbook_within_bf16_rounding(small_blocks):
    logits, targets, w_lp, w_ent = random_case(10, 50, torch.bfloat16)
    ours = grads(token_logprobs, logits, targets, 1.0, w_lp, w_ent)
    theirs = grads(textbook, logits, targets, 1.0, w_lp, w_ent)
    assert ours[0].dtype == ours[1].dtype == torch.float32 and ours[2].dtype == torch.bfloat16
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1.6e-2, atol=1e-2)


def test_a_gradient_through_the_logprobs_alone_ignores_the_entropy(small_blocks):
    logits, targets, w_lp, _ = random_case(7, 50)
    x, y = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    (w_lp * token_logprobs(x, targets)[0]).sum().backward()
    (w_lp * textbook(y, targets, 1.0)[0]).sum().backward()
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-5, atol=1e-7)


def test_the_blocked_loss_keeps_only_the_logits_for_its_backward():
    logits, targets, _, _ = random_case(64, 1000, torch.bfloat16)
    x = logits.clone().requires_grad_(True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        token_logprobs(x, targets, 1.0)
    assert not [t for t in saved if t.dtype == torch.float32 and t.numel() >= x.numel()]
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        textbook(x, targets, 1.0)
    assert [t for t in saved if t.dtype == torch.float32 and t.numel() >= x.numel()]  # the textbook keeps fp32 (N, V)


def test_the_blocked_reverse_kl_is_the_exact_kl_over_the_common_vocabulary(small_blocks):
    student, _, _, _ = random_case(10, 50)
    teacher, _, _, _ = random_case(10, 53, seed=1)  # a padded head: 3 ids the student does not have
    s, t = F.log_softmax(student, -1), F.log_softmax(teacher, -1)[:, :50]
    torch.testing.assert_close(reverse_kl(student, teacher, 1.0), (s.exp() * (s - t)).sum(-1))
    assert reverse_kl(student, student, 1.0).abs().max() < 1e-5


def test_the_head_loss_benchmark_measures_both_losses_peak_and_seconds():
    import queue

    from nanorllm.bench.head_loss import LOSSES, measure

    for loss in LOSSES:
        out = queue.Queue()
        measure(loss, "bf16", 16, 100, 1, out)
        figures = out.get_nowait()
        assert figures["peak_mib"] >= 0 and figures["seconds"] > 0
