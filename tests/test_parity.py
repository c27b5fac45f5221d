"""Sampler and learner compute the same distribution, for any causal LM family.

Tiny random Llama, Qwen2, Gemma2 (final-logit soft-capping) and Granite (logits scaling) models:
the learner's logits at the scored positions are the model's own full-forward logits, and its
logprobs of freshly sampled tokens equal the ones the sampler recorded.
"""

import pytest
import torch

from families import FAMILIES, tiny_family_policy
from nanorllm.config import TrainConfig
from nanorllm.core.types import StepSample
from nanorllm.policy import hf_causal, shared_columns
from nanorllm.policy.base import SamplingParams
from nanorllm.trainer.collate import collate_train_batch
from nanorllm.trainer.loss import token_logprobs
from nanorllm.trainer.parity import LogitParityError, check_logit_parity, startup_parity_line
from nanorllm.trainer.step import train_step
from nanorllm.trainer.update import make_optimizer


def sampled_batch(policy, *, temperature=1.0, system=None):
    """Two episodes of different lengths; the second has two turns merged into one row."""
    policy.seed(0)
    params = SamplingParams(max_new_tokens=10, temperature=temperature)
    msgs = [[{"role": "user", "content": "What is 3 + 4?"}], [{"role": "user", "content": "And 12 - 5, then?"}]]
    if system:
        msgs = [[{"role": "system", "content": system}, *m] for m in msgs]
    prompts = [policy.first_prompt_ids(m) for m in msgs]
    gens = policy.generate(msgs, prompts, params)
    samples = [StepSample(task_id=f"t{i}", episode_id=f"e{i}", turn=0, prompt_ids=p, response_ids=g.response_ids,
                          rollout_logprobs=g.logprobs) for i, (p, g) in enumerate(zip(prompts, gens))]
    second = policy.next_prompt_ids(prompts[1], gens[1].response_ids, {"role": "user", "content": "Again."})
    g2 = policy.generate(msgs[1:], [second], params)[0]
    samples.append(StepSample(task_id="t1", episode_id="e1", turn=1, prompt_ids=second,
                              response_ids=g2.response_ids, rollout_logprobs=g2.logprobs))
    return collate_train_batch(samples, pad_id=policy.pad_id)


@pytest.mark.parametrize("family", FAMILIES)
def test_learner_logits_are_the_models_own_and_match_the_sampler(family):
    policy = tiny_family_policy(family)
    batch = sampled_batch(policy)
    assert batch["input_ids"].shape[0] == 2 and batch["positions"].shape[0] > 10
    with torch.no_grad():
        logits = policy.forward(batch["input_ids"], batch["attention_mask"], batch["positions"]).logits
        full = policy.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    pos = batch["positions"]
    torch.testing.assert_close(logits, full[pos[:, 0], pos[:, 1]], atol=1e-5, rtol=1e-5)
    learner, _ = token_logprobs(logits, batch["targets"])
    assert float((learner - batch["old_logprobs"]).abs().max()) < 1e-4


@pytest.mark.parametrize("family", ["gemma2", "granite"])
def test_the_head_alone_is_not_the_model(family):
    """What the learner computed before: output embedding on the base model's hidden states."""
    policy = tiny_family_policy(family)
    batch = sampled_batch(policy)
    pos = batch["positions"]
    with torch.no_grad():
        base = getattr(policy.model, policy.model.base_model_prefix)
        hidden = base(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        head_only = policy.model.get_output_embeddings()(hidden[pos[:, 0], pos[:, 1]])
        own = policy.forward(batch["input_ids"], batch["attention_mask"], pos).logits
    assert float((head_only - own).abs().max()) > 1.0


def test_the_head_runs_only_at_scored_positions():
    policy = tiny_family_policy("gemma2")
    batch = sampled_batch(policy)
    seen = []
    head = policy.model.get_output_embeddings()
    handle = head.register_forward_hook(lambda mod, inp, out: seen.append(tuple(out.shape)))
    with torch.no_grad():
        policy.forward(batch["input_ids"], batch["attention_mask"], batch["positions"])
    handle.remove()
    assert seen == [(1, batch["positions"].shape[0], head.out_features)]  # the N scored rows, never (B, T, V)


def test_a_model_whose_head_misses_the_gathered_rows_is_refused_not_misread(monkeypatch):
    """If the forward ran a head other than the one hooked (a wrapper's copy, say), its (1, T, V) logits
    would line up with the N positions only by accident: the forward raises instead."""
    policy = tiny_family_policy("llama")
    batch = sampled_batch(policy)
    monkeypatch.setattr(policy, "_trained_model", lambda: tiny_family_policy("llama", seed=1).model)
    with pytest.raises(RuntimeError, match="did not run on the gathered rows"), torch.no_grad():
        policy.forward(batch["input_ids"], batch["attention_mask"], batch["positions"])


@pytest.mark.parametrize("family", FAMILIES)
def test_startup_check_passes_on_every_family(family):
    line = startup_parity_line(tiny_family_policy(family), temperature=0.7)
    assert line.startswith("[parity] ")


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_the_sampler_follows_whichever_attention_the_model_runs(attention, monkeypatch):
    """transformers 5.17 runs Gemma2 on its SDPA path, which drops the attention soft-capping (later
    versions pick eager, and their SDPA refuses a softcap): the slot engine must then drop it too, or
    sampler and learner compute different functions. The SDPA path is made to behave as 5.17's."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, "sdpa",
                        lambda *a, softcap=None, **kw: sdpa(*a, **kw))
    policy = tiny_family_policy("gemma2")
    policy.model.config._attn_implementation = attention
    assert startup_parity_line(policy, temperature=0.7).startswith("[parity] ")


def test_startup_check_stops_a_model_whose_logits_the_learner_gets_wrong(monkeypatch):
    policy = tiny_family_policy("gemma2")

    def head_only(input_ids, attention_mask, positions):
        base = getattr(policy.model, policy.model.base_model_prefix)
        hidden = base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return hf_causal.ForwardOutput(policy.model.get_output_embeddings()(hidden[positions[:, 0], positions[:, 1]]))

    monkeypatch.setattr(policy, "forward", head_only)
    with pytest.raises(LogitParityError, match="Gemma2ForCausalLM"):
        check_logit_parity(policy)


def test_startup_check_leaves_the_sampling_stream_alone():
    a, b = tiny_family_policy("llama"), tiny_family_policy("llama")
    a.seed(5)
    b.seed(5)
    check_logit_parity(a)
    msgs = [{"role": "user", "content": "hi"}]
    params = SamplingParams(max_new_tokens=8)
    ga = a.generate([msgs], [a.first_prompt_ids(msgs)], params)[0]
    gb = b.generate([msgs], [b.first_prompt_ids(msgs)], params)[0]
    assert ga.response_ids == gb.response_ids


# ---- dropout ----------------------------------------------------------------------------------

def _dropout_results(policy):
    from nanorllm.core.types import RolloutResult, Trajectory

    batch_samples = []
    policy.seed(0)
    msgs = [{"role": "user", "content": f"Question {i}"} for i in range(4)]
    prompts = [policy.first_prompt_ids([m]) for m in msgs]
    gens = policy.generate([[m] for m in msgs], prompts, SamplingParams(max_new_tokens=8, temperature=1.0))
    for i, (p, g) in enumerate(zip(prompts, gens)):
        reward = float(i % 2)
        batch_samples.append(RolloutResult(
            trajectory=Trajectory(task_id="t", final_reward=reward),
            step_samples=[StepSample(task_id="t", episode_id=f"e{i}", turn=0, prompt_ids=p,
                                     response_ids=g.response_ids, rollout_logprobs=g.logprobs, reward=reward)]))
    return batch_samples


@pytest.mark.parametrize("disable_dropout", [True, False])
def test_dropout_is_off_in_the_learner_by_default(disable_dropout):
    policy = tiny_family_policy("qwen2", attention_dropout=0.5)
    results = _dropout_results(policy)
    cfg = TrainConfig(model="tiny-random", temperature=1.0, disable_dropout=disable_dropout)
    m = train_step(policy, make_optimizer(policy, cfg), results, cfg)
    # approx_kl is measured on the fresh samples before the update: 0 when both sides are one function
    if disable_dropout:
        assert m["approx_kl"] < 1e-6 and m["clip_ratio/low"] == m["clip_ratio/high"] == 0
    else:
        assert m["approx_kl"] > 1e-3
    assert TrainConfig().disable_dropout is True


def test_training_refuses_truncated_sampling():
    problems = TrainConfig(top_p=0.9).validate()
    assert any(p.startswith("top_p:") and "evaluation" in p for p in problems)
    assert not TrainConfig(top_p=1.0).validate()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_shared_prompt_prefix_is_computed_once_with_the_same_logits_and_gradients(family, monkeypatch):
    policy = tiny_family_policy(family)
    batch = sampled_batch(policy, system="Answer in \\boxed{}.")
    args = (batch["input_ids"], batch["attention_mask"], batch["positions"])
    shared = batch["shared_columns"]
    assert shared >= shared_columns.MIN_SHARED_COLUMNS  # the chat markup and the system prompt
    seen = []
    handle = policy.model.register_forward_pre_hook(lambda mod, a, kw: seen.append(kw["input_ids"].shape[1]),
                                                    with_kwargs=True)
    out = []
    for min_shared in (shared_columns.MIN_SHARED_COLUMNS, 10**9):  # no count given: the forward counts
        monkeypatch.setattr(shared_columns, "MIN_SHARED_COLUMNS", min_shared)
        policy.model.zero_grad()
        logits = policy.forward(*args).logits
        logits.logsumexp(-1).sum().backward()
        out.append((logits.detach(), [p.grad.clone() for p in policy.model.parameters()]))
    handle.remove()
    T = batch["input_ids"].shape[1]
    assert seen == [T - shared, T]  # the rows' own pass starts after the shared columns
    torch.testing.assert_close(out[0][0], out[1][0], atol=2e-5, rtol=1e-5)
    for shared_grad, full_grad in zip(out[0][1], out[1][1]):
        torch.testing.assert_close(shared_grad, full_grad, atol=1e-4, rtol=1e-4)


def test_shared_columns_stop_at_the_first_difference_padding_or_scored_position():
    rows = [[1] * 10 + [2, 3], [1] * 10 + [2, 4, 4]]
    assert shared_columns.shared_columns(rows, limit=99) == 11
    assert shared_columns.shared_columns([rows[0][:10], rows[1]], limit=99) == 10  # the shorter row ends: padding
    assert shared_columns.shared_columns(rows, limit=9) == 9
    assert shared_columns.shared_columns(rows, limit=7) == 0  # under MIN_SHARED_COLUMNS
    assert shared_columns.shared_columns(rows[:1], limit=99) == 0  # one row: nothing to share
