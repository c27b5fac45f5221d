"""Step metrics computed from engine timings."""

from nanorllm.trainer.metrics import decode_metrics


def test_decode_metrics_sum_every_job_of_a_step():
    jobs = [{"decode_rows": 30, "tokens_kept": 38, "prefills": 8}, {"decode_rows": 10, "tokens_kept": 10, "prefills": 4}]
    assert decode_metrics(jobs) == {"perf/decode_useful_frac": 36 / 40, "perf/graphs": 0.0}  # no decode_steps: eager
    assert decode_metrics([{"gen_tokens": 5}]) == {}  # a policy without a decode batch reports nothing
