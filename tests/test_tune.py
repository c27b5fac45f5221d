"""Worker-count recommendation from trial rows."""

from nanorllm.bench.tune import recommend, suggest_split


def row(n, eps, learner_wait):
    return {"num_workers": n, "episodes_per_s": eps, "learner_wait_frac": learner_wait}


def test_learner_bound_when_the_learner_never_waits():
    line = recommend([row(1, 2.0, 0.40), row(2, 3.1, 0.05), row(3, 3.0, 0.01)])
    assert line.startswith("learner-bound at N=2") and "--num-workers 2" in line


def test_rollout_bound_when_the_largest_count_is_fastest_and_the_learner_waits():
    line = recommend([row(1, 1.0, 0.8), row(2, 1.9, 0.6)])
    assert line.startswith("rollout-bound up to N=2") and "--num-workers 2" in line


def test_peak_in_the_middle():
    line = recommend([row(1, 1.0, 0.8), row(2, 1.5, 0.5), row(3, 1.2, 0.5)])
    assert "peaks at N=2" in line and "--num-workers 2" in line


def test_a_worker_that_adds_less_than_the_noise_is_not_recommended():
    line = recommend([row(1, 1.00, 0.5), row(2, 1.03, 0.4), row(3, 0.9, 0.4)], flags=" --devices cpu")
    assert "peaks at N=1" in line and line.endswith("--num-workers 1 --max-policy-lag 1 --devices cpu")


def test_learner_bound_trial_gives_the_learner_more_of_eight_devices():
    """Update 3 s on one rank, rollout 0.75 s a step on each of 8 workers' worth of work (6 s on one):
    1 rank + 7 workers steps in 3 s, 2 + 6 in 1.5 s, 3 + 5 in 1.2 s, 4 + 4 in 1.5 s."""
    n, line = suggest_split({"train_s": 3.0, "rollout_s": 3.0, "num_workers": 2}, 8)
    assert n == 3 and line.endswith("--learner-devices 3 --num-workers 5")


def test_rollout_bound_trial_keeps_one_learner_rank():
    n, line = suggest_split({"train_s": 0.5, "rollout_s": 8.0, "num_workers": 1}, 4)
    assert n == 1 and "--learner-devices 1 --num-workers 3" in line
