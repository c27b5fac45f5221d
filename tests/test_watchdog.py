"""Held-out evaluation always ends: a gold no parser can finish is a counted timeout, and a hung
model or grader is reported (generating or grading, which task) instead of hanging the learner."""

import time
from types import SimpleNamespace

import pytest

import nanorllm.envs.math_env as math_env
from nanorllm.envs.base import EpisodeSettings
from nanorllm.envs.registry import load_env
from nanorllm.policy.base import SamplingParams
from nanorllm.trainer.evaluate import evaluate
from nanorllm.trainer import watchdog
from nanorllm.trainer.watchdog import Hung, Watchdog
from tests.helpers import ScriptedPolicy, wait_until

NESTED = {"task_id": "nested-power", "question": "q", "answer": "9^{9^{9^9}}"}
LONG = {"task_id": "5001-digits", "question": "q", "answer": "7" * 5001}
PLAIN = {"task_id": "plain", "question": "q", "answer": "1"}


def _eval(policy, tasks, grader_timeout_s: float = 5.0, **kw):
    env = load_env("math", EpisodeSettings(max_turns=2, grader_timeout_s=grader_timeout_s))
    return evaluate(policy, tasks, sampling=SamplingParams(max_new_tokens=8), env=env, **kw)


@pytest.mark.slow  # a fault whose wait is the behaviour under test
def test_eval_with_golds_no_parser_finishes_returns_and_counts_the_timeouts():
    policy = ScriptedPolicy(lambda call, row, messages: "\\boxed{1}")
    t0 = time.perf_counter()
    res = _eval(policy, [PLAIN, LONG, NESTED], grader_timeout_s=1)
    assert time.perf_counter() - t0 < 60  # two checks of a 1 s CPU budget, a helper start, a 10x wall backstop
    assert res["n"] == 3 and res["success_rate"] == pytest.approx(1 / 3)
    assert res["grader_timeouts"] == 2  # both turns of the nested power (the second one from the cache)
    assert res["first_timeout_task"] == "nested-power"


@pytest.mark.slow  # a fault whose wait is the behaviour under test
def test_a_hung_model_in_eval_is_reported_as_generating():
    def stuck(call, row, messages):
        time.sleep(3600)  # a generate that never returns

    with pytest.raises(Hung, match="held-out evaluation hung: .* while generating"):
        _eval(ScriptedPolicy(stuck), [PLAIN], hang_timeout_s=1)


@pytest.mark.slow  # a fault whose wait is the behaviour under test
def test_a_hung_grader_in_eval_is_reported_with_its_task(monkeypatch):
    monkeypatch.setattr(math_env, "judge", lambda *a, **k: time.sleep(3600))  # a grader that never returns
    t0 = time.perf_counter()
    with pytest.raises(Hung, match=r"while grading \(task plain\)"):
        _eval(ScriptedPolicy(lambda *_: "\\boxed{1}"), [PLAIN], hang_timeout_s=1)
    assert 1 <= time.perf_counter() - t0 < 600  # the report ended it, past its 1 s of silence


def test_a_watchdog_that_sees_beats_stays_quiet(monkeypatch):
    """Its clock moves 0.1 s a beat: 50 beats are 5 s of work, ten times its limit, each beat within it. It looks
    (reads its clock) after every step of it, however slowly this machine runs either thread."""
    now, looks = [0.0], []
    monkeypatch.setattr(watchdog, "time", SimpleNamespace(monotonic=lambda: looks.append(now[0]) or now[0]))
    with Watchdog("work", 0.5, poll_s=0.01) as dog:
        for _ in range(50):
            dog.beat("generating")
            now[0] += 0.1
            seen = len(looks)
            assert wait_until(lambda: len(looks) > seen)
    assert dog.report is None
