"""launch/bench.py sanity: the tasks kept are those whose pass rate under the base model lies in the band, the
held-out set never among them, and mastery is read off the training success the way the doc says."""

import pytest

from nanorllm.bench.sanity import SanityBenchConfig, candidates, in_band, pass_rates, reached_at, run_sanity_bench
from nanorllm.config import TrainConfig


class Episode:
    def __init__(self, task_id: str, succeeded: bool):
        self.task_id, self.succeeded = task_id, succeeded


def test_pass_rates_are_each_tasks_share_of_successful_episodes():
    results = [Episode("a", True), Episode("a", False), Episode("a", True), Episode("a", True), Episode("b", False)]
    assert pass_rates(results) == {"a": 0.75, "b": 0.0}


def test_the_band_keeps_partly_known_tasks_inclusive_and_drops_solved_hopeless_and_unsampled_ones():
    tasks = [{"task_id": t} for t in "abcdef"]
    rates = {"a": 0.0, "b": 0.125, "c": 0.2, "d": 0.5, "e": 0.8, "f": 1.0}
    assert [t["task_id"] for t in in_band(tasks + [{"task_id": "g"}], rates, 0.2, 0.8)] == ["c", "d", "e"]


def test_mastery_is_the_first_step_whose_window_mean_reaches_the_goal():
    assert reached_at([0.5, 0.9, 1.0, 1.0, 0.9], 0.95, 2) == 3
    assert reached_at([0.5, 0.8, 1.0, 0.9, 1.0], 0.95, 2) == 4
    assert reached_at([1.0, 1.0], 0.95, 3) is None and reached_at([], 0.95, 1) is None


def test_candidates_come_from_the_training_tasks_never_the_held_out_set():
    from nanorllm.run.assembly import assemble

    cfg = TrainConfig(model="tiny-random")
    held = {t["question"] for t in assemble(cfg).eval_tasks}
    pool = candidates(cfg, 50)
    assert len(pool) == 50 and not held & {t["question"] for t in pool}
    assert [t["task_id"] for t in pool] == [t["task_id"] for t in candidates(cfg, 50)]  # seeded


@pytest.mark.slow
def test_the_quick_sanity_bench_samples_keeps_and_trains_on_the_kept_tasks(tmp_path, capsys):
    import json

    assert run_sanity_bench(SanityBenchConfig(quick=True, threads=1, json=str(tmp_path / "s.json"))) == 0
    figures = json.loads((tmp_path / "s.json").read_text())["figures"]
    assert figures["candidates"] == 8 and figures["in_band"] == 8 and len(figures["success"]) == 2
    assert "[sanity] training success by step:" in capsys.readouterr().out
