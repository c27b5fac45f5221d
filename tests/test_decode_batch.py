"""In-flight batching: rows that join late, leave early or reuse their last turn's KV cache sample
exactly what a plain full forward scores, whatever else shares their batch."""

import pytest
import torch

from families import FAMILIES, tiny_family_policy
from nanorllm.bench.decode_batch import ReferencePolicy
from nanorllm.policy.base import SamplingParams
from nanorllm.rollout.engine import RolloutEngine, shared_prefix
from nanorllm.trainer.loss import token_logprobs

QUESTIONS = ["What is 1 + 1?", "Hi", "Compute 12 * 3 and explain.", "Say something long, please, about numbers."]


def full_forward_logprobs(policy, prompt, response, temperature):
    seq = prompt + response
    ids = torch.tensor([seq])
    positions = torch.tensor([(0, t - 1) for t in range(len(prompt), len(seq))])
    with torch.no_grad():
        logits = policy.forward(ids, torch.ones_like(ids), positions).logits
    return token_logprobs(logits, torch.tensor(response), temperature)[0]


def rngs(*seeds):
    return [torch.Generator().manual_seed(s) for s in seeds]


def run_rows(policy, params, schedule):
    """schedule: {step: [(key, prompt, rng, state)]} rows joining before that step; returns
    {key: (prompt, Generation, KVState)} and the batch's stats."""
    out, step = {}, 0
    prompts = {e[0]: e[1] for joins in schedule.values() for e in joins}
    with ReferencePolicy(policy).decode_batch(params) as batch:
        while len(batch) or any(s >= step for s in schedule):
            batch.join(schedule.get(step, []))
            if len(batch):
                out.update((key, (prompts[key], gen, state)) for key, gen, state in batch.step())
            step += 1
        return out, dict(batch.stats)


@pytest.mark.parametrize("family", FAMILIES)
def test_late_joiners_and_reused_caches_match_a_full_forward(family):
    policy = tiny_family_policy(family)
    params = SamplingParams(max_new_tokens=6, temperature=0.7)
    p = [policy.first_prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS]
    r = rngs(0, 1, 2, 3, 4)
    first, _ = run_rows(policy, params, {0: [("a", p[0], r[0], None), ("b", p[1], r[1], None)],
                                         3: [("c", p[2], r[2], None)]})  # c joins late, a and b leave first
    _, gen_a, state_a = first["a"]
    nxt = policy.next_prompt_ids(p[0], gen_a.response_ids, {"role": "user", "content": "Try again."})
    assert nxt[:len(state_a.token_ids)] == state_a.token_ids
    # a's next turn reuses its cache and joins a running batch whose rows have other cache lengths
    second, stats = run_rows(policy, params, {0: [("d", p[3], r[3], None)], 2: [("a2", nxt, r[4], state_a)]})
    assert stats["reused_tokens"] == len(state_a.token_ids)
    assert stats["prefill_tokens"] == len(p[3]) + len(nxt) - len(state_a.token_ids)
    for prompt, gen, _ in [*first.values(), *second.values()]:
        assert len(gen.response_ids) == len(gen.logprobs) > 0
        expected = full_forward_logprobs(policy, prompt, gen.response_ids, params.temperature)
        torch.testing.assert_close(torch.tensor(gen.logprobs), expected, rtol=0, atol=1e-4)


def test_what_a_row_samples_does_not_depend_on_its_batch():
    policy = tiny_family_policy("llama")
    params = SamplingParams(max_new_tokens=8)
    p = [policy.first_prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS]
    alone, _ = run_rows(policy, params, {0: [("x", p[2], rngs(7)[0], None)]})
    crowd, _ = run_rows(policy, params, {0: [(i, p[i], g, None) for i, g in zip([0, 1, 3], rngs(1, 2, 3))],
                                         2: [("x", p[2], rngs(7)[0], None)]})
    assert alone["x"][1].response_ids == crowd["x"][1].response_ids
    torch.testing.assert_close(alone["x"][1].logprobs, crowd["x"][1].logprobs, rtol=0, atol=1e-5)


def test_finished_rows_leave_the_batch():
    policy = tiny_family_policy("llama")
    params = SamplingParams(max_new_tokens=5)
    p = [policy.first_prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS]
    eos = policy.eos_ids[0]
    with ReferencePolicy(policy).decode_batch(params) as batch:
        batch.join([(i, p[i], g, None) for i, g in enumerate(rngs(0, 1, 2))])
        sizes, ended = [], {}
        while len(batch):
            if len(sizes) == 1:  # row 0 samples the end-of-turn token as its 2nd token
                batch.logits[0] = -1e4
                batch.logits[0, eos] = 0.0
            sizes.append(len(batch))
            ended.update((key, gen) for key, gen, _ in batch.step())
        stats = batch.stats
    assert sizes == [3, 3, 2, 2, 2]
    assert [len(ended[i].response_ids) for i in range(3)] == [2, 5, 5]
    assert stats["decode_rows"] == 3 + 2 + 2 + 2  # row 0 is not computed after its end, nobody after the 5th token
    assert stats["decode_rows"] == stats["tokens_kept"] - stats["prefills"]


def test_engine_runs_turns_in_flight_and_reuses_the_cache(tiny_policy):
    policy = tiny_policy
    eos = policy.tokenizer.eos_token_id
    boost = torch.zeros(len(policy.tokenizer))
    boost[eos] = 3.0  # turns that end before max_new_tokens go on to a second turn
    handle = policy.model.get_output_embeddings().register_forward_hook(lambda m, a, o: o + boost)
    sizes = []
    real = policy.slot_forward

    def counting(input_ids, *args):
        sizes.append(input_ids.shape)
        return real(input_ids, *args)

    policy.slot_forward = counting
    tasks = [{"task_id": f"t{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(3)]
    try:
        engine = RolloutEngine(policy, sampling=SamplingParams(max_new_tokens=10, temperature=1.0), max_turns=3,
                               max_batch_episodes=5)
        batch = engine.run(tasks, num_samples=4, seed=1)
        results = batch.results
    finally:
        handle.remove()
        del policy.slot_forward
    timings = batch.timings
    assert max(s[0] for s in sizes if s[1] > 1) <= 5  # a prefill: the joiners only
    assert max(s[0] for s in sizes if s[1] == 1) <= 5 + 1  # a decode step: slots [0, n), the shared prefix's below
    assert timings["reused_tokens"] > 0 and timings["decode_rows"] == timings["tokens_kept"] - timings["prefills"]
    assert timings["tokens_kept"] == timings["gen_tokens"] == sum(len(s.response_ids) for r in results
                                                                 for s in r.step_samples)
    multi = [r for r in results if len(r.step_samples) > 1]
    assert multi
    handle = policy.model.get_output_embeddings().register_forward_hook(lambda m, a, o: o + boost)
    try:
        for r in multi:
            for s in r.step_samples:
                expected = full_forward_logprobs(policy, s.prompt_ids, s.response_ids, 1.0)
                torch.testing.assert_close(torch.tensor(s.rollout_logprobs), expected, rtol=0, atol=1e-4)
    finally:
        handle.remove()
    # the same seed gives the same episodes with any batch bound
    again = RolloutEngine(policy, sampling=SamplingParams(max_new_tokens=10, temperature=1.0), max_turns=3,
                          max_batch_episodes=64)
    handle = policy.model.get_output_embeddings().register_forward_hook(lambda m, a, o: o + boost)
    try:
        wide = again.run(tasks, num_samples=4, seed=1).results
    finally:
        handle.remove()
    assert [[s.response_ids for s in r.step_samples] for r in results] == \
           [[s.response_ids for s in r.step_samples] for r in wide]


def test_bench_decode_counts_one_training_step(fresh_tiny_policy):
    from dataclasses import replace

    from nanorllm.bench.decode import bench_decode
    from nanorllm.config import TrainConfig
    from nanorllm.datasets.tasks import load_tasks
    from nanorllm.config.specs import task_specs

    cfg = replace(TrainConfig(), model="tiny-random", tasks_per_step=2, num_samples_per_task=2, max_new_tokens=6)
    out = bench_decode(fresh_tiny_policy, cfg, load_tasks(task_specs(cfg)[0], limit=2))
    assert out["decode_useful_frac"] == 1.0
    assert out["_tokens_kept"] == out["_decode_rows"] + out["_turns"]  # each turn's first token comes from its prefill
    assert out["gen_vs_forward"] > 0 and out["_mean_batch"] <= 4


@pytest.mark.parametrize("family", FAMILIES)
def test_rows_joining_from_a_shared_prefix_match_a_full_forward(family):
    policy = tiny_family_policy(family)
    params = SamplingParams(max_new_tokens=6, temperature=0.7)
    p = [policy.first_prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS]
    n = len(shared_prefix(p))
    assert 0 < n < min(map(len, p)) and all(q[:n] == p[0][:n] for q in p)
    with ReferencePolicy(policy).decode_batch(params) as batch:
        start = batch.cache_prefix(p[0][:n])
        batch.join([(i, p[i], g, start) for i, g in enumerate(rngs(0, 1, 2))])  # rests of different lengths
        done = dict((key, (gen, state)) for key, gen, state in batch.step())
        batch.join([(3, p[3], rngs(3)[0], start)])  # a late row joins from the same prefix
        while len(batch):
            done.update((key, (gen, state)) for key, gen, state in batch.step())
        stats = batch.stats
    assert stats["reused_tokens"] == 4 * n and stats["prefill_tokens"] == n + sum(len(q) - n for q in p)
    for i, (gen, state) in done.items():
        expected = full_forward_logprobs(policy, p[i], gen.response_ids, params.temperature)
        torch.testing.assert_close(torch.tensor(gen.logprobs), expected, rtol=0, atol=1e-4)
        assert state.token_ids == p[i] + gen.response_ids[:-1]
        assert state.layers[0][0].shape[2] == len(state.token_ids)  # the row's own columns, no padding


def test_shared_prefix_leaves_every_prompt_a_token_of_its_own():
    assert shared_prefix([[1, 2, 3, 4], [1, 2, 3, 5]]) == [1, 2, 3]
    assert shared_prefix([[1, 2, 3], [1, 2, 3]]) == [1, 2]
    assert shared_prefix([[1, 2, 3, 4], [1, 2]]) == [1]
    assert shared_prefix([[7, 2], [1, 2]]) == []


def test_sampling_params_refuse_a_temperature_that_would_sample_garbage():
    """Temperature 0 used to divide the logits by zero and decode one junk token over and over, silently."""
    with pytest.raises(ValueError, match="temperature must be > 0, got 0.0 .greedy=True"):
        SamplingParams(temperature=0.0)
    with pytest.raises(ValueError, match="top_p must be in"):
        SamplingParams(top_p=0.0)
    assert SamplingParams(temperature=0.0, greedy=True).greedy  # greedy needs no temperature
