"""The signal task sampler (datasets/sampler.py): its estimates, its band, its exploration, its determinism
and its state; and that the default order stays the uniform TaskStream. The resume test trains (slow)."""

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from nanorllm.config import TrainConfig
from nanorllm.config.specs import sampler_spec
from nanorllm.datasets.sampler import PRIOR_EPISODES as K
from nanorllm.datasets.sampler import SamplerSpec, SignalSampler, make_stream, task_kind
from nanorllm.datasets.stream import TaskStream
from nanorllm.trainer.source import FillRounds
from tests.helpers import episode
from tests.procs import read_scalars


def tasks(n: int, kind=None) -> list[dict]:
    return [{"task_id": f"t{i}", **({"kind": kind(i)} if kind else {})} for i in range(n)]


def with_stats(sampler: SignalSampler, stats: dict[str, list[int]]) -> SignalSampler:
    sampler.load_state({"stats": stats})
    return sampler


def drawn(sampler: SignalSampler, takes: int, n: int) -> Counter:
    return Counter(t["task_id"] for _ in range(takes) for t, _ in sampler.take(n))


def test_a_task_seen_little_leans_on_its_kinds_pooled_rate():
    s = with_stats(SignalSampler(tasks(4, kind=lambda i: "ab"[i % 2])), {"t0": [4, 4], "t2": [0, 1], "t1": [1, 2]})
    rate_a, rate_b = (4 + 1) / (5 + 2), (1 + 1) / (2 + 2)  # Beta(1, 1) over each kind's episodes
    assert s.kind_rates() == pytest.approx({"a": rate_a, "b": rate_b})
    est = s.estimates()
    assert est[0] == pytest.approx((4 + K * rate_a) / (4 + K))
    assert est[2] == pytest.approx((0 + K * rate_a) / (1 + K))  # one failure: pulled toward the kind, not to 0
    assert est[1] == pytest.approx((1 + K * rate_b) / (2 + K))
    assert est[3] is None  # unseen


def test_one_group_of_four_alike_leaves_the_default_band_and_a_mixed_one_stays():
    s = SignalSampler(tasks(3))
    s.observe([("t0", [True] * 4), ("t1", [False] * 4), ("t2", [True, False, True, False])])
    assert [s.in_band(m) for m in s.estimates()] == [False, False, True]
    assert s.weight(s.estimates()[0]) == 0  # outside the band: it comes back through --sampler-revisit alone
    assert s.weight(s.estimates()[2]) == pytest.approx(0.25)


def test_a_task_takes_its_kind_from_the_first_kind_field_it_has():
    assert task_kind({"kind": "add", "level": 3}) == "add"
    assert task_kind({"level": 3}) == "3"
    assert task_kind({"dataset": "gsm8k", "kind": ""}) == "gsm8k"
    assert task_kind({"question": "q"}) == ""


def test_draws_concentrate_on_the_band_and_revisit_solved_and_hopeless_tasks_rarely():
    stats = {f"t{i}": [[20, 20], [0, 20], [10, 20]][i // 10] for i in range(30)}  # solved, hopeless, in the band
    s = with_stats(SignalSampler(tasks(30), spec=SamplerSpec(explore=0.0)), stats)
    counts = drawn(s, 200, 3)
    band = sum(c for tid, c in counts.items() if int(tid[1:]) >= 20) / 600
    assert 0.91 < band < 0.98  # all but the revisit chance, 0.05 a pick
    assert sum(c for tid, c in counts.items() if int(tid[1:]) < 20) > 0  # but they come back


def test_a_wider_revisit_weight_brings_solved_tasks_back_more_often():
    stats = {f"t{i}": [20, 20] if i < 5 else [10, 20] for i in range(10)}
    share = {}
    for revisit in (0.0, 0.5):
        s = with_stats(SignalSampler(tasks(10), spec=SamplerSpec(explore=0.0, revisit=revisit)), stats)
        counts = drawn(s, 200, 1)
        share[revisit] = sum(counts[f"t{i}"] for i in range(5)) / 200
    assert share[0.0] == 0 and 0.38 < share[0.5] < 0.62


def test_the_revisit_share_does_not_grow_with_the_number_of_solved_tasks():
    stats = {f"t{i}": [20, 20] if i < 1000 else [10, 20] for i in range(1010)}  # 1000 solved, 10 in the band
    s = with_stats(SignalSampler(tasks(1010), spec=SamplerSpec(explore=0.0, revisit=0.05)), stats)
    counts = drawn(s, 400, 1)
    band = sum(c for tid, c in counts.items() if int(tid[1:]) >= 1000) / 400
    assert 0.9 < band < 0.99  # a weight per solved task (0.0125 each) would give the band 2.5 / 15, 0.17


def test_unseen_tasks_are_explored_even_when_their_kind_looks_hopeless():
    def kind(i):
        return "hard" if i < 30 else "easy"

    stats = {**{f"t{i}": [0, 20] for i in range(10)}, **{f"t{i}": [10, 20] for i in range(30, 40)}}
    share = {}
    for explore in (0.0, 0.25):
        s = with_stats(SignalSampler(tasks(40, kind=kind), spec=SamplerSpec(explore=explore)), stats)
        counts = drawn(s, 400, 1)
        share[explore] = sum(c for tid, c in counts.items() if 10 <= int(tid[1:]) < 30) / 400
    # the hard kind's 20 unseen tasks are outside the band as hopeless ones are: only the revisit chance reaches
    # them (0.05 x 20 of the 30 outside)
    assert share[0.0] < 0.1
    assert 0.2 < share[0.25] < 0.36  # the exploration share reaches them anyway: 0.25 + 0.75 x 0.033


def test_a_fresh_sampler_draws_distinct_unseen_tasks_and_group_ids_by_position():
    s = SignalSampler(tasks(6))
    picked = s.take(4)
    assert len({t["task_id"] for t, _ in picked}) == 4
    assert [g.split("@")[1] for _, g in picked] == ["0", "1", "2", "3"]
    assert all(g.startswith(t["task_id"] + "@") for t, g in picked)
    assert s.position == 4


def test_a_draw_takes_no_task_twice_nor_one_the_step_has_unless_they_run_out():
    s = SignalSampler(tasks(5))
    assert {t["task_id"] for t, _ in s.take(3, avoid={"t0", "t1"})} == {"t2", "t3", "t4"}
    seven = [t["task_id"] for t, _ in s.take(7)]
    assert len(set(seven[:5])) == 5 and len(set(seven[5:])) == 2  # all five, then round again


def test_a_draw_depends_only_on_its_position_and_the_estimates():
    stats = {f"t{i}": [i % 3, 2] for i in range(0, 20, 2)}
    a = with_stats(SignalSampler(tasks(20), seed=3), stats)
    a.take(4)
    b = with_stats(SignalSampler(tasks(20), seed=3, position=4), stats)
    assert a.take(4) == b.take(4)
    c = with_stats(SignalSampler(tasks(20), seed=4, position=8), stats)
    d = with_stats(SignalSampler(tasks(20), seed=3, position=8), {})
    assert len({str(x.take(8)) for x in (a, c, d)}) == 3  # another seed, other estimates: another draw


def test_the_state_round_trips_through_a_checkpoints_json():
    s = SignalSampler(tasks(8), seed=1)
    s.observe([("t1", [True, False]), ("t2", [True, True]), ("gone", [False])])  # a task no longer in the list
    state = json.loads(json.dumps(s.state()))
    assert state == {"stats": {"gone": [0, 1], "t1": [1, 2], "t2": [2, 2]}}
    t = SignalSampler(tasks(8), seed=1, position=s.position)
    t.load_state(state)
    assert t.estimates() == s.estimates() and t.take(5) == s.take(5)


def test_observe_returns_the_silent_share_band_share_spread_and_seen_fraction():
    s = with_stats(SignalSampler(tasks(10), spec=SamplerSpec(band=(0.2, 0.8))), {"t0": [1, 2], "t1": [8, 8]})
    m = s.observe([("t0", [True, False]), ("t1", [True, True]), ("t2", [False, False]), ("t3", [])])
    assert m["sampler/silent_share"] == pytest.approx(2 / 3)  # t1 and t2 alike; t3 had no episode left
    assert m["sampler/band_share"] == pytest.approx(1 / 3)  # t0 was in the band, t1 above, t2 unseen
    assert m["sampler/seen_frac"] == pytest.approx(3 / 10)
    est = [e for e in s.estimates() if e is not None]
    assert m["sampler/estimate_spread"] == pytest.approx(float(torch.tensor(est).std(unbiased=False)))


def test_fill_rounds_draw_none_of_the_steps_tasks_again():
    cfg = TrainConfig(tasks_per_step=2, num_samples_per_task=2, fill_batch=True, fill_batch_cap=3.0)
    s = SignalSampler(tasks(6))
    first = s.take(2)
    results = [episode(t["task_id"], "1", reward=0.0) for t, _ in first for _ in range(2)]  # constant groups
    for r, (_, gid) in zip(results, [p for p in first for _ in range(2)]):
        r.group_id = gid
    fill = FillRounds(cfg, s, 0, results)
    ids = [t["task_id"] for _, picked, _ in fill.rounds() for t, _ in picked]
    assert len(ids) == 4 and len(set(ids) | {t["task_id"] for t, _ in first}) == 6


def test_the_default_is_the_uniform_task_stream_with_no_state():
    cfg = TrainConfig()
    assert cfg.task_sampler == "uniform" and sampler_spec(cfg) is None
    stream = make_stream(tasks(5), seed=0, spec=None)
    assert type(stream) is TaskStream and stream.state() == {}
    assert sampler_spec(TrainConfig(task_sampler="signal")) == SamplerSpec()  # one default, the group's
    assert sampler_spec(TrainConfig(task_sampler="signal", sampler_band=(0.3, 0.7))) == SamplerSpec(band=(0.3, 0.7))


def test_the_sampler_settings_are_checked():
    problems = TrainConfig(sampler_band=(0.9, 0.1), sampler_explore=1.5, sampler_revisit=-1).validate()
    assert [p.split(":")[0] for p in problems if p.startswith("sampler")] == [
        "sampler_band", "sampler_explore", "sampler_revisit"]


@pytest.mark.slow
def test_a_resumed_signal_run_draws_what_the_uninterrupted_run_draws(tmp_path):
    """4 steps at once against 2 then resumed to 4 (fill_batch's rounds included): the same groups each step,
    the same weights, and the estimates in the checkpoint."""
    from nanorllm.run.lifecycle import main
    from tests.runs import SERIAL, length_rule_grading

    args = [*SERIAL, "--output-dir", str(tmp_path), "--task-sampler", "signal", "--tasks", "arith:count=12",
            "--drop-zero-std-groups", "--fill-batch", "--eval-limit", "1", "--no-save-model", "--save-every", "1"]
    with length_rule_grading():
        assert main([*args, "--run-name", "full", "--max-steps", "4"]) == 0
        assert main([*args, "--run-name", "part", "--max-steps", "2"]) == 0
        assert main(["--resume", str(tmp_path / "part"), "--max-steps", "4"]) == 0

    def groups(run: Path) -> dict[int, set[str]]:
        recs = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
        return {s: {r["group_id"] for r in recs if r["step"] == s} for s in range(1, 5)}

    full, part = tmp_path / "full", tmp_path / "part"
    assert groups(full) == groups(part) and all(groups(full).values())
    a, b = (load_file(str(r / "checkpoints" / "step_4" / "model" / "model.safetensors")) for r in (full, part))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    states = [json.loads((r / "checkpoints" / "step_4" / "trainer_state.json").read_text()) for r in (full, part)]
    assert states[0]["sampler"] == states[1]["sampler"] and states[0]["sampler"]["stats"]
    scalars = read_scalars(part)
    assert [s for s, _ in scalars["sampler/seen_frac"]] == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_pipelined_run_draws_from_the_signal_sampler_and_keeps_its_estimates(tmp_path):
    """One worker, lag 1: every step's groups are new positions (exactly once), the scalars are written each
    step and the last checkpoint holds an estimate for every task trained."""
    from nanorllm.run.lifecycle import main
    from tests.runs import TINY_ARGS

    run = tmp_path / "pipe"
    assert main([*TINY_ARGS, "--num-workers", "1", "--max-steps", "3", "--task-sampler", "signal", "--tasks",
                 "arith:count=12", "--eval-limit", "1", "--no-save-model", "--output-dir", str(tmp_path),
                 "--run-name", "pipe"]) == 0
    recs = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    positions = {s: {int(r["group_id"].split("@")[1]) for r in recs if r["step"] == s} for s in (1, 2, 3)}
    assert sorted(p for ps in positions.values() for p in ps) == list(range(3 * len(positions[1])))
    assert [s for s, _ in read_scalars(run)["sampler/seen_frac"]] == [1, 2, 3]
    state = json.loads((run / "checkpoints" / "step_3" / "trainer_state.json").read_text())
    assert set(state["sampler"]["stats"]) == {r["task_id"] for r in recs}
