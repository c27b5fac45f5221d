"""The slot engine (policy/slot_batch.py) samples what the DecodeBatch samples, token for token, while
rows join, leave, come back for another turn in their own slot, start from a shared prefix, outgrow the
cache or see new weights; its pieces (counter-based uniforms, bucket sizes, memory check, graph
fallback) behave as documented."""

import pytest
import torch

from families import FAMILIES, tiny_family_policy
from nanorllm.bench.decode_batch import ReferencePolicy
from nanorllm.policy.base import SamplingParams
from nanorllm.policy.decode_graphs import DecodeGraphs, StepGraph
from nanorllm.policy.sampler import counter_uniforms
from nanorllm.policy.slot_cache import (CacheTooLarge, buckets, check_fits, context_bucket, context_buckets, model_shape,
                                        slot_ranges)
from nanorllm.rollout.engine import RolloutEngine, shared_prefix
from nanorllm.trainer.metrics import decode_metrics

QUESTIONS = ["What is 1 + 1?", "Hi", "Compute 12 * 3 and explain.", "Say something long, please, about numbers."]
JOINS = {0: [0, 1, 2], 2: [3], 3: [4, 5], 7: [6]}  # row k asks QUESTIONS[k % 4]
AGAIN = (0, 3)  # these come back for a second turn on their state


def on_engine(policy, engine: str):
    """The policy on the slot engine ("slots") or on the reference DecodeBatch ("dynamic")."""
    return ReferencePolicy(policy) if engine == "dynamic" else policy


def run_rows(policy, params, engine, *, prefix: bool = False, on_batch=None, **cache):
    """{key: (Generation, state)} and the stats, for the JOINS schedule on `engine`."""
    prompts = {k: policy.first_prompt_ids([{"role": "user", "content": QUESTIONS[k % 4]}])
               for joins in JOINS.values() for k in joins}
    out, pending, step = {}, [], 0
    with on_engine(policy, engine).decode_batch(params, **cache) as batch:
        if on_batch:
            on_batch(batch)
        start = batch.cache_prefix(shared_prefix(list(prompts.values()))) if prefix else None
        while len(batch) or pending or any(s >= step for s in JOINS):
            batch.join([(k, prompts[k], torch.Generator().manual_seed(k), start) for k in JOINS.get(step, [])]
                       + pending)
            pending = []
            if len(batch):
                for key, gen, state in batch.step():
                    out[key] = (gen, state)
                    if key in AGAIN:
                        prompts[key, 2] = policy.next_prompt_ids(prompts[key], gen.response_ids,
                                                                 {"role": "user", "content": "Try again."})
                        pending.append(((key, 2), prompts[key, 2], torch.Generator().manual_seed(100 + key), state))
            step += 1
        return out, dict(batch.stats)


def assert_same(slots, dynamic, atol=1e-4):
    assert slots.keys() == dynamic.keys()
    for key, (gen, state) in dynamic.items():
        s_gen, s_state = slots[key]
        assert s_gen.response_ids == gen.response_ids, key
        torch.testing.assert_close(torch.tensor(s_gen.logprobs), torch.tensor(gen.logprobs), rtol=0, atol=atol)
        assert s_state.token_ids == state.token_ids


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("prefix", [False, True])
def test_slots_sample_what_the_decode_batch_samples(family, prefix):
    policy = tiny_family_policy(family)
    params = SamplingParams(max_new_tokens=8, temperature=0.7)
    dynamic, d_stats = run_rows(policy, params, "dynamic", prefix=prefix)
    slots, s_stats = run_rows(policy, params, "slots", prefix=prefix)
    assert_same(slots, dynamic)  # these families' x20 weights give logits in the hundreds
    for k in AGAIN:  # the second turn ran in the first turn's slot, prefilling only its new tokens
        assert slots[k, 2][1].slot == slots[k][1].slot
    for name in ("prefill_tokens", "reused_tokens", "tokens_kept", "decode_rows", "prefills"):
        assert s_stats[name] == d_stats[name], name
    assert s_stats["reused_tokens"] >= sum(len(slots[k][1].token_ids) for k in AGAIN)


def test_an_episode_longer_than_the_cache_grows_it_and_corrupts_no_other_slot():
    policy = tiny_family_policy("llama")
    params = SamplingParams(max_new_tokens=12, temperature=0.7)
    dynamic, _ = run_rows(policy, params, "dynamic")
    first = policy.ensure_slot_cache(2, 16).version
    slots, _ = run_rows(policy, params, "slots", slots=2, width=16)  # fewer slots than rows, columns than any prompt
    assert_same(slots, dynamic)
    assert policy.slot_cache.slots >= 4 and policy.slot_cache.width >= 32 and policy.slot_cache.version >= 2 + first


def test_a_row_crossing_a_context_bucket_moves_to_the_next_and_samples_the_same_tokens():
    """Small context buckets on CPU: steps read 8, 16, 32, ... columns, never the whole cache, and rows
    that outgrow a bucket mid-turn (and the cache's width) sample what the DecodeBatch samples."""
    policy = tiny_family_policy("gemma2")  # sliding window and soft-capping over a bucketed width
    params = SamplingParams(max_new_tokens=12, temperature=0.7)
    dynamic, _ = run_rows(policy, params, "dynamic")
    widths = []

    def small_buckets(batch):
        batch.min_context = 8
        step = batch.decode_step
        batch.decode_step = lambda tok, pos, *a: (widths.append((a[1], int(pos.max()), batch.cache.width)),
                                                  step(tok, pos, *a))[1]

    slots, _ = run_rows(policy, params, "slots", on_batch=small_buckets, width=16)
    assert_same(slots, dynamic)
    assert all(w == context_bucket(p + 1, cache_w, 8) for w, p, cache_w in widths)  # the smallest that covers
    assert len({w for w, _, _ in widths}) >= 2 and any(w < cache_w for w, _, cache_w in widths)
    assert widths[-1][2] > 16  # the cache grew past its first width on the way


def test_a_decode_step_never_writes_the_slot_of_an_episode_between_turns():
    """Row i of a step is slot i: the held slot 0 lies inside the steps of the rows above it, idle."""
    policy = tiny_family_policy("llama")
    params = SamplingParams(max_new_tokens=6, temperature=0.7)
    p = [policy.first_prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS]
    with policy.decode_batch(params) as batch:
        batch.join([(0, p[0], torch.Generator().manual_seed(0), None)])
        done = []
        while len(batch):
            done += batch.step()
        (_, _, held), = done
        assert held.slot == 0 and held.held
        before = [buf[0].clone() for buf in (*batch.cache.keys, *batch.cache.values)]
        batch.join([(k, p[k], torch.Generator().manual_seed(k), None) for k in (1, 2, 3)])
        steps = 0
        while len(batch):
            assert all(r.slot in (1, 2, 3) for r in batch.rows)
            batch.step()
            steps += 1
        assert steps >= 6 and batch.stats["decode_steps"] >= 6
        for old, buf in zip(before, (*batch.cache.keys, *batch.cache.values)):
            assert torch.equal(old, buf[0])


def test_context_buckets_are_powers_of_two_up_to_the_width():
    assert context_buckets(448) == [128, 256, 448] and context_buckets(100) == [100]
    assert context_bucket(129, 448) == 256 and context_bucket(5, 448) == 128 and context_bucket(300, 448) == 448
    assert context_bucket(9, 64, 8) == 16


def test_new_weights_copied_in_place_are_what_the_next_step_reads():
    policy = tiny_family_policy("qwen2")
    params = SamplingParams(max_new_tokens=6, temperature=0.7)
    run_rows(policy, params, "slots")  # the cache (and on a GPU its graphs) exist before the reload
    ptrs = [p.data_ptr() for p in policy.model.parameters()]
    with torch.no_grad():
        for p in policy.model.parameters():
            p.copy_(p * 1.3)  # as SharedWeights.load_into does: into the tensors, never rebinding them
    assert ptrs == [p.data_ptr() for p in policy.model.parameters()]
    dynamic, _ = run_rows(policy, params, "dynamic")
    slots, _ = run_rows(policy, params, "slots")
    assert_same(slots, dynamic)


def test_rollouts_on_either_engine_are_the_same_episodes(tiny_policy):
    policy = tiny_policy
    boost = torch.zeros(len(policy.tokenizer))
    boost[policy.tokenizer.eos_token_id] = 3.0  # turns that end early go on to a second turn
    handle = policy.model.get_output_embeddings().register_forward_hook(lambda m, a, o: o + boost)
    tasks = [{"task_id": f"t{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(3)]
    runs, steps = {}, []
    try:
        for engine in ("dynamic", "slots"):
            e = RolloutEngine(on_engine(policy, engine), sampling=SamplingParams(max_new_tokens=10), max_turns=3,
                              max_batch_episodes=5)
            e.on_step = lambda: steps.append(engine)
            runs[engine] = e.run(tasks, num_samples=4, seed=1)
    finally:
        handle.remove()
    episodes = {k: [[(s.prompt_ids, s.response_ids) for s in r.step_samples] for r in v.results]
                for k, v in runs.items()}
    assert episodes["slots"] == episodes["dynamic"]
    assert any(len(e) > 1 for e in episodes["slots"])
    for a, b in zip(runs["dynamic"].results, runs["slots"].results):
        for sa, sb in zip(a.step_samples, b.step_samples):
            torch.testing.assert_close(sb.rollout_logprobs, sa.rollout_logprobs, rtol=0, atol=1e-5)
    timings = runs["slots"].timings
    m = decode_metrics([timings])
    assert m["perf/decode_useful_frac"] == 1.0 and m["perf/graphs"] == 0.0
    assert 0.5 < m["perf/decode_live_frac"] < 1.0  # the shared prefix's slot is computed idle in every step
    assert m["perf/decode_context"] == timings["attended_columns"] / timings["decode_steps"] > 0
    assert timings["reused_tokens"] == runs["dynamic"].timings["reused_tokens"] > 0
    assert steps.count("slots") == steps.count("dynamic") > 0  # the heartbeat hook runs every step
    assert policy.slot_cache.free == list(range(policy.slot_cache.slots - 1, -1, -1))  # every slot back


def test_counter_sampler_draws_do_not_depend_on_the_batch():
    """The CUDA sampler, run on CPU: a row's tokens are a function of its seed and position only."""
    policy = tiny_family_policy("llama")
    params = SamplingParams(max_new_tokens=8)
    p = [policy.first_prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS]

    def sample(keys):
        out = {}
        with policy.decode_batch(params) as batch:
            batch.counter_rng = True
            batch.join([(k, p[k], torch.Generator().manual_seed(k), None) for k in keys])
            while len(batch):
                out.update((key, gen.response_ids) for key, gen, _ in batch.step())
        return out

    alone, crowd = sample([2]), sample([0, 1, 2, 3])
    assert alone[2] == crowd[2] and len({tuple(v) for v in crowd.values()}) > 1


def test_counter_uniforms_are_reproducible_and_uniform():
    seeds = torch.arange(4096, dtype=torch.long) * 7919 + (1 << 40)
    u = counter_uniforms(seeds, torch.full_like(seeds, 5))
    assert torch.equal(u, counter_uniforms(seeds, torch.full_like(seeds, 5)))
    assert ((u > 0) & (u < 1)).all()
    assert abs(float(u.mean()) - 0.5) < 0.02 and abs(float(u.var()) - 1 / 12) < 0.01
    hist = torch.histc(u, bins=8, min=0, max=1)
    assert hist.min() > 0.8 * 4096 / 8
    other = counter_uniforms(seeds, torch.full_like(seeds, 6))
    assert float((u - other).abs().mean()) > 0.2  # the next token's draw is a fresh number


def test_a_cache_that_cannot_fit_is_refused_with_the_figure_and_the_flag():
    policy = tiny_family_policy("llama")
    with pytest.raises(CacheTooLarge, match="--max-batch-episodes") as e:
        check_fits(policy.model, slots=1 << 24, width=1 << 20, dtype=torch.float32, device=torch.device("cpu"))
    assert "GiB" in str(e.value)
    assert check_fits(policy.model, slots=4, width=64, dtype=torch.float32, device=torch.device("cpu")) == \
        2 * 2 * 5 * 2 * 64 * 16 * 4  # k and v, layers, slots + scratch, kv heads, width, head dim, bytes


def test_batch_size_buckets_cover_every_batch():
    assert buckets(256) == [8, 16, 32, 64, 128, 256]
    assert buckets(3) == [8] and buckets(100)[-1] == 128
    assert slot_ranges(257) == [8, 16, 32, 64, 128, 256, 257] and slot_ranges(33) == [8, 16, 32, 33]
    assert slot_ranges(5) == [5]  # a step never runs past the cache's slots


def test_a_failed_capture_warns_once_and_decodes_eagerly(capsys):
    """On CPU a capture always fails (no CUDA): the fallback path is what runs."""
    policy = tiny_family_policy("llama")
    params = SamplingParams(max_new_tokens=6, temperature=0.7)
    dynamic, _ = run_rows(policy, params, "dynamic")
    graphs = DecodeGraphs()
    slots, stats = run_rows(policy, params, "slots", on_batch=lambda b: setattr(b, "graphs", graphs))
    assert_same(slots, dynamic)
    assert graphs.failed and not graphs.graphs
    assert capsys.readouterr().err.count("WARNING: CUDA graph capture failed") == 1
    assert stats["graph_steps"] == 0 and stats["decode_steps"] > 0


class EagerStepGraph(StepGraph):
    """A CUDA graph's contract, on CPU: capture runs the step once and keeps its outputs; a replay runs
    it again over the same static inputs and writes into those same output tensors."""

    def capture(self, step, pool) -> None:
        self.step, self.out = step, step()

    def replay(self) -> None:
        for held, new in zip(self.out, self.step()):
            held.copy_(new)


@pytest.mark.parametrize("greedy", [False, True])
def test_the_graph_path_maps_rows_onto_its_buckets_and_samples_what_eager_samples(greedy):
    """DecodeGraphs' bookkeeping (slot-range and context keys, static inputs per slot, seeds, reading
    the rows' outputs back) on CPU, with an eager stand-in for the graph: the same tokens as the eager
    step with the same (counter-based) uniforms, every decode step replayed."""
    policy = tiny_family_policy("qwen2")
    params = SamplingParams(max_new_tokens=10, temperature=0.7, greedy=greedy)

    def counter(batch):
        batch.counter_rng = True

    def graphed(batch):
        counter(batch)
        batch.graphs = DecodeGraphs()
        batch.graphs.graph_type = EagerStepGraph
        graphs.append(batch.graphs)

    graphs = []
    eager, _ = run_rows(policy, params, "slots", on_batch=counter, slots=20)
    replayed, stats = run_rows(policy, params, "slots", on_batch=graphed, slots=20)
    assert_same(replayed, eager)
    assert stats["graph_steps"] == stats["decode_steps"] > 0 and not graphs[0].failed
    keys = set(graphs[0].graphs)
    assert {k[0] for k in keys} == {8} and {k[1] for k in keys} == {128}  # slots 0-7 used, short contexts
    assert stats["computed_rows"] == 8 * stats["decode_steps"]


def test_rows_left_high_at_a_rollouts_tail_move_down_to_a_smaller_slot_range():
    """12 rows join, then 6 more (slots 12-17: range 32); the first 12 finish and 11 are released, one
    stays held between turns. The 6 late rows move to free slots below 8, so steps run a range of 8
    slots, not 32 (on CPU: 7 rows, not 18); tokens are still the DecodeBatch's and the held slot is
    untouched."""
    policy = tiny_family_policy("llama")
    params = SamplingParams(max_new_tokens=8, temperature=0.7)
    prompts = [policy.first_prompt_ids([{"role": "user", "content": QUESTIONS[k % 4] + " " * (k // 4)}])
               for k in range(18)]
    runs = {}
    for engine in ("dynamic", "slots"):
        out, rows_run = {}, []
        with on_engine(policy, engine).decode_batch(params, slots=64, width=128) as batch:
            if engine == "slots":
                step = batch.decode_step
                batch.decode_step = lambda tok, *a: (rows_run.append(len(tok)), step(tok, *a))[1]
            batch.join([(k, prompts[k], torch.Generator().manual_seed(k), None) for k in range(12)])
            for i in range(3):
                out.update((k, (g, st)) for k, g, st in batch.step())
            batch.join([(k, prompts[k], torch.Generator().manual_seed(k), None) for k in range(12, 18)])
            while len(batch):
                for k, g, st in batch.step():
                    out[k] = (g, st)
                    if engine == "slots" and k < 12 and k != 3:
                        batch.release(st)
                    if engine == "slots" and k == 11:  # the first 12 are done: the held one's slot now
                        held = out[3][1]
                        before = [buf[held.slot].clone() for buf in (*batch.cache.keys, *batch.cache.values)]
            if engine == "slots":
                moved, late = batch.stats["slot_moves"], sorted(out[k][1].slot for k in range(12, 18))
                after = [buf[held.slot].clone() for buf in (*batch.cache.keys, *batch.cache.values)]
        runs[engine] = out
    assert_same(runs["slots"], runs["dynamic"])
    assert moved == 6 and late == [0, 1, 2, 4, 5, 6]  # slot 3 is held
    assert 18 in rows_run and rows_run[-1] == 7  # eager runs up to the highest live slot: 18 rows, then 7
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_eager_steps_close_every_hole_and_graph_steps_only_a_bucket_drop():
    """Eager (CPU) a step computes exactly the slots up to the highest live one, so a released slot
    below live rows is filled from the top at once; under graphs only a smaller bucket is worth a
    copy. Rows 0 and 1 end early (rows 2-4 joined two steps later), the top rows move into their
    slots, and every row samples what the DecodeBatch samples."""
    policy = tiny_family_policy("qwen2")
    params = SamplingParams(max_new_tokens=6, temperature=0.7)
    prompts = [policy.first_prompt_ids([{"role": "user", "content": QUESTIONS[k % 4]}]) for k in range(5)]
    runs, slots_seen = {}, []
    for engine in ("dynamic", "slots"):
        out = {}
        with on_engine(policy, engine).decode_batch(params, slots=8, width=128) as batch:
            batch.join([(k, prompts[k], torch.Generator().manual_seed(k), None) for k in (0, 1)])
            for _ in range(2):
                batch.step()
            batch.join([(k, prompts[k], torch.Generator().manual_seed(k), None) for k in (2, 3, 4)])
            while len(batch):
                for k, g, st in batch.step():
                    out[k] = (g, st)
                    if engine == "slots":
                        batch.release(st)
                if engine == "slots" and len(batch):
                    slots_seen.append(sorted(r.slot for r in batch.rows))
            moves = batch.stats["slot_moves"]
        runs[engine] = out
    for key in runs["dynamic"]:
        assert runs["slots"][key][0].response_ids == runs["dynamic"][key][0].response_ids
    assert moves == 2 and [0, 1, 2] in slots_seen  # rows 3 and 4 took slots 0 and 1
    with policy.decode_batch(params, slots=8, width=128) as batch:  # the rows a step computes, either way
        assert [batch.step_rows(n) for n in (1, 3, 8)] == [1, 3, 8]
        batch.graphs = DecodeGraphs()
        assert [batch.step_rows(n) for n in (1, 3, 8)] == [8, 8, 8]  # one bucket: no move is worth a copy


@pytest.mark.parametrize("family", FAMILIES)
def test_the_decode_step_reads_nothing_back_from_the_device(family):
    """What a CUDA graph captures must not ask the device for a value (a capture would fail and every
    step run eagerly) nor build a tensor from host data: no such op runs in any family's decode step."""
    from helpers import HostReads

    policy = tiny_family_policy(family)
    prompt = policy.first_prompt_ids([{"role": "user", "content": QUESTIONS[2]}])
    for greedy in (False, True):
        with policy.decode_batch(SamplingParams(max_new_tokens=8, temperature=0.7, greedy=greedy)) as batch:
            batch.counter_rng = True
            batch.join([(k, prompt, torch.Generator().manual_seed(k), None) for k in range(3)])
            batch.step()
            n, at = 8, torch.arange(3)
            tok, pos, write = batch.slot_inputs(n, at, batch.next[0], torch.full((3,), len(prompt)))
            seeds = torch.arange(n)
            with HostReads(also=frozenset({torch.ops.aten.lift_fresh.default})) as reads:
                t, lp = batch.decode_step(tok, pos, write, batch.cache.width,
                                          lambda: None if greedy else counter_uniforms(seeds, pos + 1))
        assert t.shape == lp.shape == (n,) and reads.ops > 100
        assert not reads.seen, reads.seen


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_graph_replay_matches_eager_before_and_after_a_reload():
    policy = tiny_family_policy("llama")
    policy.model.cuda()
    policy.device = torch.device("cuda")
    params = SamplingParams(max_new_tokens=8, greedy=True)
    for scale in (1.0, 1.3):
        with torch.no_grad():
            for p in policy.model.parameters():
                p.mul_(scale)
        policy.graphs_enabled = False
        eager, _ = run_rows(policy, params, "slots")
        policy.graphs_enabled = True
        replayed, stats = run_rows(policy, params, "slots")
        assert stats["graph_steps"] > 0
        assert_same(replayed, eager, atol=1e-3)


@pytest.mark.slow
def test_a_run_prints_its_cache_size_and_refuses_one_that_cannot_fit(tmp_path):
    from tests.procs import run_train

    rc, out, _ = run_train(["--serial", "--max-steps", "1", "--max-new-tokens", "4", "--tasks-per-step", "64",
                            "--num-samples-per-task", "2", "--max-batch-episodes", "100", "--run-name", "ok"], tmp_path)
    assert rc == 0, out
    assert "[engine] slot KV cache: 101 slots x" in out  # min(--max-batch-episodes, a step's 128) + the shared prefix
    rc, out, _ = run_train(["--serial", "--max-steps", "1", "--max-new-tokens", "1000000000", "--run-name", "huge"],
                           tmp_path)
    # refused before a step: the memory plan counts rows no wider than the model's context (a row scores no more
    # tokens than it holds), so the context check names the flag; a cache too big for memory names its own
    assert rc == 2 and "step 1/1" not in out
    assert "lower --max-turns or --max-new-tokens" in out or ("--max-batch-episodes" in out and "kv " in out)


@pytest.mark.slow
def test_the_compaction_benchmark_compares_both_rules_and_puts_the_engine_back():
    from nanorllm.bench.compaction_cpu import RULES, compare

    out = compare("tiny-random", runs=2)
    assert out["same_episodes"] and set(out["rollout_s"]) == set(RULES) and all(out["rollout_s"].values())
    from nanorllm.policy.slot_batch import SlotBatch

    assert SlotBatch.step_rows is RULES["every_hole"]  # the engine's own rule again after the comparison


def test_attention_reads_the_cache_in_its_own_dtype_with_a_kv_heads_queries_as_its_rows(monkeypatch):
    """fp32 parameters under bf16 autocast (the learner's own evaluation, `--serial --dtype bf16`): the
    query comes out of RoPE in fp32 and takes the bf16 cache's dtype, never the attended keys the
    query's (a copy of every column read, every layer, every step). Prefill and decode alike hand SDPA
    as many query heads as key heads (a kv head's queries as its rows), never `enable_gqa` with a
    mask, which no memory-efficient or flash kernel takes."""
    import torch.nn.functional as F

    policy = tiny_family_policy("llama")
    policy.compute_dtype = torch.bfloat16  # fp32 masters, bf16 compute: HFCausalPolicy.from_name(dtype="bf16")
    calls, sdpa = [], F.scaled_dot_product_attention

    def recording(q, k, v, **kw):
        calls.append((q.dtype, k.dtype, v.dtype, q.shape[1], k.shape[1], q.shape[2], kw.get("enable_gqa", False)))
        return sdpa(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    prompt = policy.first_prompt_ids([{"role": "user", "content": QUESTIONS[2]}])
    with policy.decode_batch(SamplingParams(max_new_tokens=3, temperature=0.7)) as batch:
        assert batch.cache.dtype == torch.bfloat16
        batch.join([(k, prompt, torch.Generator().manual_seed(k), None) for k in range(2)])
        while len(batch):
            batch.step()
    monkeypatch.undo()
    layers, kv_heads, _ = model_shape(policy.model)
    assert len(calls) >= 3 * layers  # the prefill and two decode steps, every layer
    assert {c[:3] for c in calls} == {(torch.bfloat16,) * 3}
    assert {(c[3], c[4], c[6]) for c in calls} == {(kv_heads, kv_heads, False)}
    groups = policy.model.config.num_attention_heads // kv_heads
    assert {c[5] for c in calls} == {groups * len(prompt), groups}  # prefill rows, then one query per head a step


def test_graphs_captured_before_the_parameters_move_are_recaptured_not_replayed():
    """The learner's startup parity check decodes (graphs captured), then the shared weight store
    moves every parameter into its block. A CUDA graph replays the addresses it recorded, so a graph
    from before the move would read freed memory. The stand-in here holds that contract (it records
    the parameters' addresses at capture and refuses a replay after they moved): after the move every
    step runs on a graph captured anew and samples what eager samples."""
    from nanorllm.pipeline.weights import SharedWeights

    policy = tiny_family_policy("qwen2")
    params = SamplingParams(max_new_tokens=6, temperature=0.7)

    class AddressBoundStepGraph(EagerStepGraph):
        def capture(self, step, pool) -> None:
            self.addresses = [p.data_ptr() for p in policy.model.parameters()]
            super().capture(step, pool)

        def replay(self) -> None:
            assert [p.data_ptr() for p in policy.model.parameters()] == self.addresses, "a graph's weights moved"
            super().replay()

    graphs = DecodeGraphs()
    graphs.graph_type = AddressBoundStepGraph

    def counter(batch):
        batch.counter_rng = True

    def graphed(batch):
        counter(batch)
        batch.graphs = graphs

    eager, _ = run_rows(policy, params, "slots", on_batch=counter, slots=20)
    first, _ = run_rows(policy, params, "slots", on_batch=graphed, slots=20)
    captured = set(graphs.graphs)
    weights = SharedWeights(policy.model, version=0, readers=None)  # what PipelineSource does to the learner's model
    try:
        moved, stats = run_rows(policy, params, "slots", on_batch=graphed, slots=20)
    finally:
        weights.close()
    assert_same(first, eager)
    assert_same(moved, eager)
    assert stats["graph_steps"] == stats["decode_steps"] > 0
    assert captured and set(graphs.graphs) and not captured & set(graphs.graphs)  # all captured anew


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_graphs_capture_on_a_gpu_that_is_not_the_current_device():
    """A policy on cuda:1 while cuda:0 is current (a single-rank learner placed there before it set its
    device): the capture stream is made on the policy's device, so its steps replay, not fall back."""
    policy = tiny_family_policy("llama")
    policy.model.to("cuda:1")
    policy.device = torch.device("cuda:1")
    torch.cuda.set_device(0)
    params = SamplingParams(max_new_tokens=8, greedy=True)
    policy.graphs_enabled = False
    eager, _ = run_rows(policy, params, "slots")
    policy.graphs_enabled = True
    replayed, stats = run_rows(policy, params, "slots")
    assert not policy.decode_graphs.failed and stats["graph_steps"] > 0
    assert_same(replayed, eager, atol=1e-3)
