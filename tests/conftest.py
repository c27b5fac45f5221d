import gc

import pytest
import torch

torch.set_flush_denormal(True)
torch.set_num_threads(1)


def pytest_collection_finish(session):
    """Everything the test modules imported (torch, transformers, the package) goes to the collector's
    permanent generation: the package's memory checks run `gc.collect()` before each KV cache they size,
    and with those objects in view each one took ~1 s of a unit test. What the tests build is collected as
    before."""
    gc.collect()
    gc.freeze()


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
