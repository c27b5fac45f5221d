"""The learner's GPU figure, as a dry run on CPU: every precision measured, MFU left unknown off a known card."""

from nanorllm.bench.gpu_learner import PRECISIONS, figures, synthetic_results


def test_synthetic_batch_has_the_stated_shape():
    results = synthetic_results()
    assert len(results) == 256 and all(len(r.step_samples) == 2 for r in results)
    first, second = results[0].step_samples
    assert len(first.prompt_ids) == 100 and 30 <= len(first.response_ids) <= 90
    n = len(first.prompt_ids) + len(first.response_ids)
    assert second.prompt_ids[:n] == first.prompt_ids + first.response_ids  # turn 2 extends turn 1
    assert results[0].step_samples[0].prompt_ids[:80] == results[-1].step_samples[0].prompt_ids[:80]  # the template


def test_quick_figures_run_every_precision_on_cpu():
    f = figures("cpu", quick=True)
    for name in PRECISIONS:
        assert f[f"learner_update_s_{name}"] > 0 and f[f"learner_tokens_per_s_{name}"] > 0
        assert f[f"learner_mfu_{name}"] is None  # no known peak on a CPU
    assert f["_episodes"] == 16 and f["_tokens"] > 0
