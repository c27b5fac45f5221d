"""The update-memory bench (nanorllm/bench/update_memory.py): its episodes have the shapes it names, and it runs."""

import pytest

from nanorllm.bench.update_memory import QUICK, SHAPES, episodes, run
from nanorllm.trainer.micro_batches import episode_length


def test_game_episodes_are_long_unshared_multi_turn_rows_and_math_ones_short():
    game, math = episodes(SHAPES["game"], seed=0), episodes(SHAPES["math"], seed=0)
    assert (len(game), len(math)) == (56, 32)
    game_rows = [episode_length(r.step_samples) for r in game]
    math_rows = [episode_length(r.step_samples) for r in math]
    assert min(game_rows) >= 480 + 30 and max(game_rows) <= 620 + 5 * (64 + 140)
    assert max(math_rows) <= 130 + 2 * 32 + 15
    assert {len(r.step_samples) for r in game} == {1, 2, 3, 4, 5}
    for r in game + math:  # each turn's prompt extends the last turn's prompt and reply: one merged row
        for a, b in zip(r.step_samples, r.step_samples[1:]):
            assert b.prompt_ids[:len(a.prompt_ids) + len(a.response_ids)] == a.prompt_ids + a.response_ids
    assert episodes(SHAPES["game"], seed=1) != game  # each update draws new lengths
    assert [len(r.step_samples) for r in episodes(SHAPES["game"], seed=0)] == [len(r.step_samples) for r in game]


@pytest.mark.slow  # it trains (a toy model, two updates)
def test_quick_run_trains_every_episode_of_each_update_and_reports_its_memory():
    rows = run("game", 2, quick=True)
    assert [r["update"] for r in rows] == [0, 1]
    for i, r in enumerate(rows):
        assert r["samples"] == sum(len(e.step_samples) for e in episodes(QUICK["game"], seed=i))  # nothing dropped
        assert r["passes"] >= 1 and r["padded_tokens"] >= r["samples"]
        assert 0 < r["resident_after_gb"] <= r["peak_gb"]
