from types import SimpleNamespace

import pytest
import torch

import nanorllm.envs.math_env as math_env
from helpers import ScriptedPolicy
from nanorllm.policy.base import SamplingParams
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.trainer.loss import token_logprobs

TASKS = [{"task_id": f"t{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(3)]
RIGHT, WRONG = "\\boxed{{{}}}", "\\boxed{99}"


def engine(policy, **kw):
    return RolloutEngine(policy, sampling=SamplingParams(max_new_tokens=8), **kw)


def test_all_live_episodes_share_one_generate_call_per_turn():
    # turn 0: task 0 right in every sample; tasks 1 and 2 wrong. turn 1: everyone wrong.
    script = [[RIGHT.format(1)] * 4 + [WRONG] * 8, [WRONG] * 8]
    policy = ScriptedPolicy(script)
    results = engine(policy, max_turns=2).run(TASKS, num_samples=4).results
    assert policy.batch_sizes == [12, 8]
    assert len(results) == 12
    assert [r.trajectory.termination_reason for r in results] == ["correct"] * 4 + ["max_turns"] * 8
    assert [r.reward for r in results] == [1.0] * 4 + [0.0] * 8


def test_max_batch_episodes_chunks_generate_calls():
    policy = ScriptedPolicy(lambda call, row, messages: WRONG)
    results = engine(policy, max_turns=2, max_batch_episodes=5).run(TASKS, num_samples=4).results
    assert policy.batch_sizes == [5, 5, 2, 5, 5, 2]
    assert all(r.trajectory.num_turns == 2 for r in results)


def test_results_are_task_major_and_group_id_defaults_to_task_id():
    policy = ScriptedPolicy(lambda call, row, messages: WRONG)
    results = engine(policy, max_turns=1).run(TASKS, num_samples=2).results
    assert [r.task_id for r in results] == ["t0", "t0", "t1", "t1", "t2", "t2"]
    assert [r.group_id for r in results] == ["t0", "t0", "t1", "t1", "t2", "t2"]
    assert [r.step_samples[0].episode_id for r in results] == ["t0#0", "t0#1", "t1#0", "t1#1", "t2#0", "t2#1"]


def test_explicit_group_ids_and_seed():
    policy = ScriptedPolicy(lambda call, row, messages: WRONG)
    results = engine(policy, max_turns=1).run(TASKS[:2], num_samples=2, group_ids=["a", "b"], seed=11).results
    assert [r.group_id for r in results] == ["a", "a", "b", "b"]
    assert [r.task_id for r in results] == ["t0", "t0", "t1", "t1"]
    assert policy.seeds == [11]


def test_step_samples_one_per_turn_with_final_reward():
    script = [[WRONG, "no box"], ["\\boxed{2}", WRONG], [RIGHT.format(1), WRONG]]
    policy = ScriptedPolicy(script)
    r0, r1 = engine(policy, max_turns=3).run(TASKS[:1], num_samples=2).results
    assert policy.batch_sizes == [2, 2, 2]
    assert [s.turn for s in r0.step_samples] == [0, 1, 2]
    assert {s.episode_id for s in r0.step_samples} == {"t0#0"}
    assert [s.reward for s in r0.step_samples] == [1.0, 1.0, 1.0]
    assert r0.trajectory.termination_reason == "correct" and r0.trajectory.terminated
    assert [s.turn for s in r1.step_samples] == [0, 1, 2]
    assert r1.trajectory.termination_reason == "max_turns"
    assert [s.reward for s in r1.step_samples] == [0.0, 0.0, 0.0]
    assert [s.response_ids for s in r0.step_samples] == [[1] * len(WRONG), [1] * 9, [1] * 9]
    assert [s.rollout_logprobs for s in r0.step_samples][1] == [-0.5] * 9


def test_later_prompts_extend_earlier_prompt_and_response():
    policy = ScriptedPolicy(lambda call, row, messages: WRONG)
    (r,) = engine(policy, max_turns=3).run(TASKS[:1], num_samples=1).results
    p0, p1, p2 = (s.prompt_ids for s in r.step_samples)
    assert p1 == p0 + [1] * len(WRONG) + [4, 4]
    assert p2 == p1 + [1] * len(WRONG) + [4, 4]
    assert policy.prompts[1] == [p1]


def test_truncated_response_with_turns_left_ends_episode():
    script = [[(WRONG, True), (WRONG, False)], [WRONG]]
    policy = ScriptedPolicy(script)
    r0, r1 = engine(policy, max_turns=2).run(TASKS[:1], num_samples=2).results
    assert policy.batch_sizes == [2, 1]
    assert r0.trajectory.termination_reason == "truncated"
    assert r0.trajectory.terminated is False
    assert len(r0.step_samples) == 1 and r0.step_samples[0].truncated
    assert r0.trajectory.steps[-1].done is True
    assert r1.trajectory.termination_reason == "max_turns" and len(r1.step_samples) == 2


def test_truncated_but_correct_counts_as_correct():
    policy = ScriptedPolicy([[(RIGHT.format(1), True)]])
    (r,) = engine(policy, max_turns=2).run(TASKS[:1], num_samples=1).results
    assert (r.trajectory.termination_reason, r.reward) == ("correct", 1.0)


def test_env_error_ends_only_that_episode(monkeypatch):
    real_judge = math_env.judge

    def flaky_judge(response, gold, **kw):
        if "BOOM" in response:
            raise RuntimeError("grader exploded")
        return real_judge(response, gold, **kw)

    monkeypatch.setattr(math_env, "judge", flaky_judge)
    script = [[WRONG, "BOOM", RIGHT.format(1)], [RIGHT.format(1)]]
    policy = ScriptedPolicy(script)
    r0, r1, r2 = engine(policy, max_turns=2).run(TASKS[:1], num_samples=3).results
    assert policy.batch_sizes == [3, 1]
    assert [r.trajectory.termination_reason for r in (r0, r1, r2)] == ["correct", "error", "correct"]
    assert (r1.reward, r1.trajectory.terminated, len(r1.step_samples)) == (0.0, False, 1)
    assert "grader exploded" in r1.trajectory.steps[-1].info["error"]
    assert [len(r.step_samples) for r in (r0, r2)] == [2, 1]


def test_results_carry_policy_version_and_the_call_its_timings():
    policy = ScriptedPolicy(lambda call, row, messages: WRONG)
    policy.version = 5
    batch = engine(policy, max_turns=2).run(TASKS[:1], num_samples=2)
    assert all(r.policy_version == 5 for r in batch.results)
    assert all(s.policy_version == 5 for r in batch.results for s in r.step_samples)
    assert batch.timings["gen_tokens"] == 4 * len(WRONG)
    assert batch.timings["rollout_s"] >= batch.timings["generate_s"] >= 0


# ---- the real tiny model -----------------------------------------------------------------------

def _prompts(policy):
    qs = ["What is 1 + 1?", "Hi", "Compute 12 * 3 and explain."]
    return [policy.first_prompt_ids([{"role": "user", "content": q}]) for q in qs]


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_generate_logprobs_match_full_forward(tiny_policy, temperature):
    policy = tiny_policy
    prompts = _prompts(policy)
    assert len({len(p) for p in prompts}) == 3
    policy.seed(0)
    gens = policy.generate([[]] * 3, prompts, SamplingParams(max_new_tokens=12, temperature=temperature))
    for prompt, gen in zip(prompts, gens):
        assert len(gen.logprobs) == len(gen.response_ids) > 0
        seq = prompt + gen.response_ids
        ids = torch.tensor([seq])
        positions = torch.tensor([(0, t - 1) for t in range(len(prompt), len(seq))])
        with torch.no_grad():
            logits = policy.forward(ids, torch.ones_like(ids), positions).logits
        lp, _ = token_logprobs(logits, torch.tensor(gen.response_ids), temperature)
        torch.testing.assert_close(torch.tensor(gen.logprobs), lp, rtol=0, atol=1e-4)


def test_generate_greedy_logprobs_use_unit_temperature(tiny_policy):
    policy = tiny_policy
    prompt = _prompts(policy)[0]
    (gen,) = policy.generate([[]], [prompt], SamplingParams(max_new_tokens=6, greedy=True, temperature=0.5))
    seq = prompt + gen.response_ids
    ids = torch.tensor([seq])
    positions = torch.tensor([(0, t - 1) for t in range(len(prompt), len(seq))])
    with torch.no_grad():
        logits = policy.forward(ids, torch.ones_like(ids), positions).logits
    assert gen.response_ids == logits.argmax(-1).tolist()
    lp, _ = token_logprobs(logits, torch.tensor(gen.response_ids), 1.0)
    torch.testing.assert_close(torch.tensor(gen.logprobs), lp, rtol=0, atol=1e-4)


def test_generate_stops_at_first_eos_and_flags_truncation(tiny_policy):
    policy = tiny_policy
    eos = policy.tokenizer.eos_token_id
    boost = torch.zeros(len(policy.tokenizer))
    boost[eos] = 3.0  # about half the rows end within 10 tokens, whatever the seed
    head = policy.model.get_output_embeddings()
    handle = head.register_forward_hook(lambda module, args, out: out + boost)
    try:
        policy.seed(3)
        prompts = _prompts(policy) * 3
        gens = policy.generate([[]] * len(prompts), prompts, SamplingParams(max_new_tokens=10))
    finally:
        handle.remove()
    ended = [g for g in gens if not g.truncated]
    cut = [g for g in gens if g.truncated]
    assert ended and cut
    for g in ended:
        assert g.response_ids[-1] in policy.eos_ids
        assert not any(t in policy.eos_ids for t in g.response_ids[:-1])
        assert len(g.response_ids) <= 10 and len(g.logprobs) == len(g.response_ids)
    for g in cut:
        assert len(g.response_ids) == 10
        assert not any(t in policy.eos_ids for t in g.response_ids)
    assert all(len(g.logprobs) == len(g.response_ids) for g in gens)  # nothing after a row's end


def test_same_seed_same_samples(tiny_policy):
    policy = tiny_policy
    prompts = _prompts(policy)
    params = SamplingParams(max_new_tokens=8)
    policy.seed(123)
    a = policy.generate([[]] * 3, prompts, params)
    policy.seed(123)
    b = policy.generate([[]] * 3, prompts, params)
    c = policy.generate([[]] * 3, prompts, params)
    assert [g.response_ids for g in a] == [g.response_ids for g in b]
    assert [g.logprobs for g in a] == [g.logprobs for g in b]
    assert [g.response_ids for g in a] != [g.response_ids for g in c]


def test_next_prompt_ids_extends_prompt_and_response(tiny_policy):
    policy = tiny_policy
    prompt = _prompts(policy)[0]
    response = policy.tokenizer("\\boxed{3}", add_special_tokens=False)["input_ids"]
    nxt = policy.next_prompt_ids(prompt, response, {"role": "user", "content": "Try again."})
    assert nxt[:len(prompt) + len(response)] == prompt + response
    tail = policy.tokenizer.decode(nxt[len(prompt) + len(response):])
    assert tail == "<|im_end|>\n<|im_start|>user\nTry again.<|im_end|>\n<|im_start|>assistant\n"


def test_next_prompt_ids_after_eos_does_not_repeat_it(tiny_policy):
    policy = tiny_policy
    prompt = _prompts(policy)[0]
    eos = policy.tokenizer.eos_token_id
    response = policy.tokenizer("\\boxed{3}", add_special_tokens=False)["input_ids"] + [eos]
    nxt = policy.next_prompt_ids(prompt, response, {"role": "user", "content": "Try again."})
    assert nxt[:len(prompt) + len(response)] == prompt + response
    assert policy.tokenizer.decode(nxt[len(prompt) + len(response):]) == (
        "\n<|im_start|>user\nTry again.<|im_end|>\n<|im_start|>assistant\n")


def test_tiny_policy_only_ends_turns_on_im_end(tiny_policy):
    policy = tiny_policy
    assert policy.tokenizer.decode([2]) == "#"
    assert policy.eos_ids == [policy.tokenizer.eos_token_id]


def test_next_prompt_ids_keeps_end_of_turn_after_other_stop_token(tiny_policy, monkeypatch):
    """A model may stop on several ids; only the tokenizer's end-of-turn id already closes the turn."""
    policy = tiny_policy
    monkeypatch.setattr(policy, "eos_ids", sorted({*policy.eos_ids, 2}))
    prompt = _prompts(policy)[0]
    response = policy.tokenizer("x #", add_special_tokens=False)["input_ids"]
    assert response[-1] in policy.eos_ids
    nxt = policy.next_prompt_ids(prompt, response, {"role": "user", "content": "Try again."})
    assert nxt[len(prompt) + len(response)] == policy.tokenizer.eos_token_id


def test_a_cpu_rollout_hands_its_freed_buffers_back_once_a_call_even_when_it_fails(tiny_policy, monkeypatch):
    # a prefill's and a decode step's buffers change size call by call: held, a process's heap grows with them
    import nanorllm.policy.slot_cache as slot_cache
    import nanorllm.rollout.engine as rollout_engine

    calls = []
    monkeypatch.setattr(slot_cache, "_LIBC", SimpleNamespace(malloc_trim=calls.append))
    engine(tiny_policy, max_turns=1).run(TASKS[:2], num_samples=2)
    assert calls == [0]
    engine(ScriptedPolicy(lambda call, row, messages: WRONG), max_turns=1).run(TASKS[:1])
    assert calls == [0]  # a policy with no device (a script, an API model): nothing of ours to trim
    slot_cache.trim_host_heap(torch.device("cuda"))
    assert calls == [0]  # a GPU's tensors are not on the host heap
    monkeypatch.setattr(rollout_engine.RolloutEngine, "_run", lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        engine(tiny_policy).run(TASKS[:1])
    assert calls == [0, 0]
