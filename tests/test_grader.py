"""The grader's contract as tables: which boxed forms a gold answer accepts, and which it refuses."""

import os
import time
from fractions import Fraction

import pytest

from nanorllm.envs.grader import check_answer, grade, judge, parse_number
from nanorllm.envs.math_env import MathEnv
from nanorllm.trainer.metrics import rollout_metrics

# (boxed answer, gold): a plain number equal to the gold
ACCEPTED = [
    ("-13", "-13"), ("\u221213", "-13"), ("- 13", "-13"), ("+7", "7"), ("7", "+7"),
    ("7.0", "7"), ("7.", "7"), ("7.000", "7"), (".5", "0.5"), ("0.50", "1/2"),
    ("1,000", "1000"), ("1000", "1,000"), ("1{,}000", "1000"), ("12,345,678", "12345678"),
    ("-1,000.5", "-1000.5"),
    ("\\frac{1}{2}", "0.5"), ("\\dfrac{3}{4}", "0.75"), ("\\tfrac{1}{3}", "1/3"), ("-\\frac{1}{2}", "-0.5"),
    ("1/3", "\\frac{1}{3}"), ("1/2", "2/4"), ("3/2", "\\frac{6}{4}"),  # a gold need not be reduced
    ("$7$", "7"), ("$-13$", "-13"), ("\\(7\\)", "7"), ("  7  ", "7"), ("1\\!000", "1000"),
    ("\\text{7}", "7"), ("7 \\text{ apples}", "7"), ("7\\text{cm}", "7"), ("7 \\mathrm{m}", "7"),
    ("7 apples", "7"), ("\\$18", "18"), ("18 \\text{dollars}", "18"), ("50\\%", "50"), ("90^\\circ", "90"),
    ("90^{\\circ}", "90"), ("007", "7"),
]

# (boxed answer, gold): expressions, equations, lists, unreduced fractions and non-numbers score 0
REJECTED = [
    ("4 - 17", "-13"), ("3+4", "7"), ("0.7 \\times 10", "7"), ("14/2", "7"), ("\\frac{14}{2}", "7"),
    ("7/1", "7"), ("2/4", "0.5"), ("\\frac{2}{4}", "0.5"), ("8 = 7", "7"), ("x = 7", "7"), ("7, 7", "7"),
    ("7,7", "77"), ("1,00", "100"), ("12,34", "1234"), ("1 000", "1000"), ("1e3", "1000"),
    ("10^3", "1000"), ("\\sqrt{49}", "7"), ("7!", "5040"), ("-(-7)", "7"), ("|-7|", "7"), ("7x", "7"),
    ("7 \\text{ or } 8", "7"), ("\\text{7 or 8}", "7"), ("7 or 8", "7"), ("seven", "7"), ("", "0"),
    ("\\frac{-1}{2}", "-0.5"), ("6", "7"), ("-7", "7"), ("0.333", "1/3"), ("\\frac{1}{0}", "1"),
    ("7 \\cdot 1", "7"), ("7 + 0", "7"), ("(7)", "7"), ("{7}", "7"), ("7.5.1", "7.5"),
]


@pytest.mark.parametrize("answer,gold", ACCEPTED)
def test_numeric_gold_accepts_a_plain_number(answer, gold):
    assert check_answer(answer, gold) == (True, False)


@pytest.mark.parametrize("answer,gold", REJECTED)
def test_numeric_gold_rejects_everything_else(answer, gold):
    assert check_answer(answer, gold) == (False, False)


@pytest.mark.parametrize("text,value", [("1,000", Fraction(1000)), ("-0.25", Fraction(-1, 4)),
                                        ("\\frac{2}{4}", None), ("3+4", None), ("", None)])
def test_parse_number_is_exact(text, value):
    assert parse_number(text) == value


def test_a_symbolic_gold_keeps_math_verify_equivalence():
    assert check_answer("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}") == (True, False)
    assert check_answer("2^{1/2}", "\\sqrt{2}") == (True, False)
    assert check_answer("x + 1", "1 + x") == (True, False)
    assert check_answer("\\sqrt{3}", "\\sqrt{2}") == (False, False)


def test_numeric_checks_never_reach_the_symbolic_checker(no_symbolic_check):
    for answer, gold in ACCEPTED + REJECTED:
        assert check_answer(answer, gold)[1] is False


@pytest.mark.slow  # a fault whose wait is the behaviour under test
def test_a_gold_no_parser_finishes_is_a_counted_timeout_within_the_budget():
    """9^(9^(9^9)) makes sympy compute a power inside one C call that no Python signal interrupts:
    the helper process is killed at the CPU budget, and the next check gets a fresh one."""
    from nanorllm.envs.symbolic import CHECKER

    CHECKER._child()  # the helper is started outside the timed part
    t0 = time.perf_counter()
    v = judge("\\boxed{1}", "9^{9^{9^9}}", cpu_limit_s=2)
    took = time.perf_counter() - t0
    assert (v.correct, v.extracted, v.timed_out) == (False, "1", True)
    assert 2 <= took < 2 * 10  # CPU budget 2 s; the wall backstop is 10x it on a starved machine
    assert CHECKER._proc is None  # killed, not left computing
    assert check_answer("2^{1/2}", "\\sqrt{2}") == (True, False)  # a fresh helper
    env = MathEnv(max_turns=1, grader_timeout_s=1)
    env.reset({"task_id": "t", "question": "q", "answer": "9^{9^{9^9}} + 1"})
    assert env.step("\\boxed{2}")[3]["grader_timeout"] is True


def test_a_gold_longer_than_pythons_int_string_limit_is_compared_exactly(no_symbolic_check):
    gold = "7" * 5001  # int() refuses more than 4,300 digits
    assert judge("\\boxed{1}", gold) == judge("\\boxed{1}", gold)
    assert judge("\\boxed{1}", gold).correct is False and judge("\\boxed{1}", gold).timed_out is False
    assert check_answer("0.5", "0.5" + "0" * 5000) == (True, False)
    assert check_answer("2/3", "\\frac{" + "2" * 5001 + "}{" + "3" * 5001 + "}") == (True, False)


@pytest.mark.slow  # a fault whose wait is the behaviour under test
def test_a_stopped_machine_does_not_flip_a_verdict():
    """Time the helper spends not running (a busy CPU, here SIGSTOP) does not count against the CPU budget."""
    import signal
    import threading

    from nanorllm.envs.symbolic import CHECKER

    CHECKER._child()  # the helper is up
    pid = CHECKER._proc.pid
    os.kill(pid, signal.SIGSTOP)
    threading.Timer(1.0, os.kill, (pid, signal.SIGCONT)).start()
    t0 = time.perf_counter()
    v = judge("\\boxed{2^{1/2}}", "\\sqrt{2}", cpu_limit_s=0.5)
    assert (v.correct, v.timed_out) == (True, False)
    assert time.perf_counter() - t0 >= 1.0


def test_grader_timeouts_reach_the_rollout_metrics():
    from nanorllm.core.types import RolloutResult, Step, Trajectory

    def result(timeouts):
        steps = [Step(observation="q", info={"grader_timeout": True}) for _ in range(timeouts)] + [Step("q")]
        return RolloutResult(trajectory=Trajectory(task_id="t", steps=steps), step_samples=[])

    assert rollout_metrics([result(0), result(2), result(1)])["reward/grader_timeouts"] == 3
    assert rollout_metrics([result(0)])["reward/grader_timeouts"] == 0


def test_grade_returns_the_box_content():
    assert grade("so \\boxed{4 - 17}.", "-13") == (False, "4 - 17")
    assert grade("so \\boxed{-13}.", "-13") == (True, "-13")
