"""The static decode batch (fixed-shape buffers, a compiled decode step) samples what the DecodeBatch
samples, token for token, while rows join, leave and come back for another turn on their KV state."""

from dataclasses import replace

import pytest
import torch

from families import FAMILIES, tiny_family_policy
from nanorllm.config import TrainConfig
from nanorllm.datasets.tasks import load_tasks
from nanorllm.policy.base import SamplingParams
from nanorllm.rollout.build import sampling_params, training_engine
from nanorllm.trainer.evaluate import evaluate

QUESTIONS = ["What is 1 + 1?", "Hi", "Compute 12 * 3 and explain.", "Say something long, please, about numbers."]
# Fresh rows joining before these steps (row k asks QUESTIONS[k % 4]): a crowd that leaves at once,
# then a stream of single rows that outlives the columns, with two small crowds; the second puts short
# rows into slots that were free for longer than they are. Rows 0 and 6 come back for a second turn.
JOINS = {0: [0, 1, 2, 3, 4, 5], 3: [6], 5: [7], 9: [8], 14: [9, 10, 11],
         **{step: [k] for k, step in enumerate(range(20, 160, 4), start=12)}}
JOINS[24] += [60, 61]
JOINS[72] += [65, 69]
AGAIN = (0, 6)


def run_rows(policy, params, *, compiled):
    """{key: (Generation, KVState)}, the (slots, columns, next column) after each step (static batch only)
    and the batch."""
    prompts = {k: policy.first_prompt_ids([{"role": "user", "content": QUESTIONS[k % 4]}])
               for joins in JOINS.values() for k in joins}
    out, shapes, pending, step = {}, [], [], 0
    with policy.decode_batch(params, compiled=compiled) as batch:
        while len(batch) or pending or any(s >= step for s in JOINS):
            joining = [(k, prompts[k], torch.Generator().manual_seed(k), None) for k in JOINS.get(step, [])]
            batch.join(joining + pending)
            pending = []
            if compiled:  # each row's slot attends to its own tokens, ending at column col - 1
                for row, slot in zip(batch.rows, batch.slots):
                    n = len(row.prompt_ids) + len(row.tokens)
                    assert batch.attn[slot].sum() == n and batch.attn[slot, batch.col - n:batch.col].all()
            if len(batch):
                for key, gen, state in batch.step():
                    out[key] = (gen, state)
                    if key in AGAIN:
                        prompts[key, 2] = policy.next_prompt_ids(prompts[key], gen.response_ids,
                                                                 {"role": "user", "content": "Try again."})
                        pending.append(((key, 2), prompts[key, 2], torch.Generator().manual_seed(100 + key), state))
                if compiled and batch.attn is not None:
                    shapes.append((*batch.attn.shape, batch.col))
            step += 1
        return out, shapes, batch


def assert_same_rows(static, dynamic, atol):
    assert static.keys() == dynamic.keys()
    for key, (gen, state) in dynamic.items():
        s_gen, s_state = static[key]
        assert s_gen.response_ids == gen.response_ids, key
        torch.testing.assert_close(torch.tensor(s_gen.logprobs), torch.tensor(gen.logprobs), rtol=0, atol=atol)
        assert s_state.token_ids == state.token_ids
        for (sk, sv), (k, v) in zip(s_state.layers, state.layers):
            torch.testing.assert_close(sk, k, rtol=0, atol=atol)
            torch.testing.assert_close(sv, v, rtol=0, atol=atol)


@pytest.mark.parametrize("family", [FAMILIES[0], *(pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES[1:])])
def test_static_layout_samples_what_the_dynamic_batch_samples(family):  # one family in the everyday tier
    """The slot/column bookkeeping alone: the model runs eagerly over the static cache (no compile)."""
    policy = tiny_family_policy(family)
    policy._compiled_model = policy.model
    params = SamplingParams(max_new_tokens=8, temperature=0.7)
    dynamic, _, _ = run_rows(policy, params, compiled=False)
    static, shapes, batch = run_rows(policy, params, compiled=True)
    assert_same_rows(static, dynamic, atol=1e-4)  # these families' x20 weights give logits in the hundreds
    slots = [s for s, _, _ in shapes]
    assert slots[0] == 8 and 2 in slots and slots.index(4) > slots.index(2) and slots[-1] < 8  # shrank, grew back
    assert any(col == width for _, width, col in shapes)  # the columns ran out: repacked before the next step
    assert batch.stats["repacks"] >= 5
    assert (0, 2) in static and (6, 2) in static  # second turns ran, on their reused KV states


@pytest.mark.slow
def test_compiled_decode_samples_what_the_eager_decode_samples(fresh_tiny_policy):
    """torch.compile for real (tiny model): the same tokens, logprobs equal to float rounding, also
    after the weights move to new storage with new values (as when a learner shares them)."""
    policy = fresh_tiny_policy
    params = SamplingParams(max_new_tokens=8, temperature=0.7)
    for scale in (1.0, 1.5):  # compiled with the first weights, then run with the second
        for p in policy.model.parameters():
            p.data = p.data * scale
        dynamic, _, _ = run_rows(policy, params, compiled=False)
        static, _, _ = run_rows(policy, params, compiled=True)
        assert_same_rows(static, dynamic, atol=1e-5)


def test_training_engine_and_evaluation_ask_for_the_compiled_decode(fresh_tiny_policy, monkeypatch):
    policy = fresh_tiny_policy
    policy._compiled_model = policy.model  # which batch each path asks for, not the compile
    asked, real = [], policy.decode_batch
    monkeypatch.setattr(policy, "decode_batch", lambda params, **kw: asked.append(kw["compiled"]) or real(params, **kw))
    cfg = replace(TrainConfig(), model="tiny-random", compile_decode=True, max_new_tokens=3, max_turns=1)
    tasks = load_tasks(cfg.tasks, limit=1)
    training_engine(policy, cfg).run(tasks, num_samples=2, seed=0)
    evaluate(policy, tasks, sampling=sampling_params(cfg), max_turns=1, compile_decode=True)
    training_engine(policy, replace(cfg, compile_decode=False)).run(tasks, num_samples=2, seed=0)
    assert asked == [True, True, False]
