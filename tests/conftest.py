import gc
import os
import sys

import pytest
import torch

from nanorllm.faultsuite.process import TrainProcess
from nanorllm.utils.precision import AUTO_ENV
from tests import forked

# `--dtype auto` means fp32 in every test and every process a test starts, whatever this CPU's units: the tests'
# exact counts and byte-identical runs are fp32's; tests/test_precision_choice.py tests the hardware's choice
os.environ.setdefault(AUTO_ENV, "float32")
torch.set_flush_denormal(True)
torch.set_num_threads(1)
TrainProcess.popen = forked.Popen  # the fault rows' runs fork from a warm interpreter (tests/procs.py)


def pytest_collection_finish(session):
    """Everything the test modules imported (torch, transformers, the package) goes to the collector's
    permanent generation: the package's memory checks run `gc.collect()` before each KV cache they size,
    and with those objects in view each one took ~1 s of a unit test. What the tests build is collected as
    before."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def first_imports_frozen():
    """What a test imports first (an integration's library: verifiers, OpenEnv's server with gradio) joins that
    permanent generation when the test ends, its garbage collected first: left in view, OpenEnv's 170,000
    objects alone cost every later `gc.collect()` 80 ms."""
    before = len(sys.modules)
    yield
    if len(sys.modules) > before:
        gc.collect()
        gc.freeze()


# the sets behind the package's "printed once per process" error lines, by module
PRINTED_ONCE = {"nanorllm.rollout.engine": "_reported_errors", "nanorllm.rollout.agent_runner": "_reported",
                "nanorllm.rewards.functions": "_reported", "nanorllm.rewards.judge": "_reported"}


@pytest.fixture(autouse=True)
def nothing_printed_yet():
    """Each test starts as a fresh process would, with none of the printed-once lines said: a test that reads one
    must not depend on which tests ran before it in the same pytest worker."""
    for module, name in PRINTED_ONCE.items():
        if module in sys.modules:
            getattr(sys.modules[module], name).clear()


@pytest.fixture
def no_symbolic_check(monkeypatch):
    """Fails the test if an answer reaches the symbolic checker (envs/symbolic.py): what a fast path must avoid."""
    from nanorllm.envs.symbolic import CHECKER

    def asked(predicted, gold, *args, **kwargs):
        raise AssertionError(f"the symbolic checker was asked: {predicted[:40]!r} against {gold[:40]!r}")

    monkeypatch.setattr(CHECKER, "check", asked)


def _tiny():
    from nanorllm.policy.hf_causal import HFCausalPolicy

    return HFCausalPolicy.from_name("tiny-random")


@pytest.fixture(scope="session")
def tiny_policy():
    """Shared, read-only: tests that train must use `fresh_tiny_policy`."""
    return _tiny()


@pytest.fixture
def fresh_tiny_policy():
    return _tiny()


@pytest.fixture
def tiny_policy_factory():
    """Builds any number of fresh tiny policies; all start from the same weights."""
    return _tiny


# ---- the tiny runs many tests read (tests/runs.py): each trains once a session ----------------------
@pytest.fixture(scope="session")
def serial_runs(tmp_path_factory, worker_id):
    from tests import runs

    return runs.once(tmp_path_factory, worker_id, "serial", runs.serial_runs)


@pytest.fixture(scope="session")
def lora_runs(tmp_path_factory, worker_id):
    from tests import runs

    return runs.once(tmp_path_factory, worker_id, "lora", runs.lora_runs)


@pytest.fixture(scope="session")
def pipeline_run(tmp_path_factory, worker_id):
    from tests import runs

    return runs.once(tmp_path_factory, worker_id, "pipeline", runs.pipeline_run)
