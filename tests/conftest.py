import pytest
import torch

torch.set_flush_denormal(True)
torch.set_num_threads(1)


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
