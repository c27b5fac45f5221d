"""Learner ranks with the model sharded (--learner-parallel fsdp, ranks/fsdp.py): the 2-rank step equals
the 1-rank step, a real run's checkpoint is the full plain state and resumes on one DDP rank, a killed
rank stops the run without writing a checkpoint whose optimizer state is partial."""

import os
import re
import signal

import pytest
import torch
from transformers import AutoModelForCausalLM

from nanorllm.bench.learner_ranks import steps_on_ranks
from nanorllm.faultsuite.ledger import groups_of, leftovers
from nanorllm.faultsuite.process import PIPELINE, TrainProcess
from nanorllm.faultsuite.proc_scan import shm_entries
from nanorllm.config import TrainConfig
from nanorllm.run.ranks import start_ranks
from nanorllm.trainer.checkpoint import complete_steps
from nanorllm.utils.devices import DeviceError, resolve_devices
from tests.procs import read_scalars
from tests.test_train_step import build_results, config


# every step updates (tiny-random's rewards are all equal: weight decay alone moves the weights)
FSDP = ["--learner-devices", "2", "--learner-parallel", "fsdp", "--no-drop-zero-std-groups", "--lr", "1e-3",
        "--weight-decay", "0.1", "--save-every", "2"]


@pytest.mark.slow
def test_two_sharded_ranks_step_equals_one_rank_step(tiny_policy):
    """The DDP parity cases (full forward), on FSDP: token-mean over micro-batches (the shares have
    different micro-batch counts: the rank with fewer runs idle ones), seq-mean, one group only (rank 1
    trains nothing), and the dropout-on proximal forward (idle micro-batches mirror it)."""
    results = build_results(tiny_policy)
    one_group = build_results(tiny_policy, rewards={"g0": [1.0, 0.0, 0.0, 1.0]}, two_turns={("g0", 1)})
    full = {"disable_dropout": False}
    cases = [(config(loss_agg="token-mean", micro_batch_tokens=40, **full), results),
             (config(loss_agg="seq-mean", micro_batch_tokens=4096, **full), results),
             (config(**full), one_group),
             (config(off_policy_correction="tis", micro_batch_tokens=40, **full), one_group)]
    one = steps_on_ranks(1, cases)
    two = steps_on_ranks(2, cases, parallel="fsdp")
    start = torch.cat([p.detach().flatten() for p in tiny_policy.model.parameters()])
    for a, b in zip(one, two):
        assert float((a["params"] - b["params"]).abs().max()) <= 1e-5
        assert float((a["params"] - start).abs().max()) > 1e-3
        assert b["gather_s"] > 0  # rank 0's model came from the gather


def test_fsdp_with_one_learner_rank_is_refused_by_name():
    """A DeviceError, which launch/train.py reports as bad input (exit 2) before anything is written."""
    cfg = TrainConfig(serial=True, learner_parallel="fsdp")
    devices = resolve_devices(cfg.devices, cfg.num_workers, serial=True, learner_spec=None)
    with pytest.raises(DeviceError, match="learner_parallel: fsdp shards the learner over several ranks"):
        start_ranks(devices, 60.0, parallel=cfg.learner_parallel)
    assert start_ranks(devices, 60.0, parallel="ddp").world == 1
    assert "learner_parallel: must be 'ddp' or 'fsdp', got 'zero'" in TrainConfig(learner_parallel="zero").validate()


@pytest.mark.slow
def test_a_sharded_run_saves_the_full_state_and_resumes_on_one_ddp_rank(tmp_path):
    args = [*PIPELINE, *FSDP, "--max-steps", "3", "--run-name", "fsdp"]
    run = TrainProcess(args, tmp_path)
    assert run.wait(timeout=900) == 0, run.output()[-3000:]
    run_dir = tmp_path / "fsdp"
    assert "step 3/3" in run.output() and "[ranks] 2 learner ranks" in run.output()
    assert complete_steps(run_dir) == [2, 3]
    ckpt = run_dir / "checkpoints" / "step_3"
    model = AutoModelForCausalLM.from_pretrained(ckpt / "model")
    final = AutoModelForCausalLM.from_pretrained(run_dir / "final_model")
    start = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / "step_2" / "model")
    params = list(model.parameters())
    for p, q in zip(params, final.parameters()):
        assert torch.equal(p, q)
    assert max(float((p - q).detach().abs().max()) for p, q in zip(params, start.parameters())) > 0  # step 3 trained
    state = torch.load(ckpt / "optimizer.pt", weights_only=True)
    assert sorted(state["state"]) == list(range(len(params)))  # plain: keyed by position, every parameter
    for i, p in enumerate(params):
        assert state["state"][i]["exp_avg"].shape == p.shape  # whole, not a shard
        assert float(state["state"][i]["step"]) == 3
    assert state["param_groups"][0]["params"] == list(range(len(params)))
    assert all(v > 0 for _, v in read_scalars(run_dir)["perf/gather_s"])
    resumed = TrainProcess(["--resume", str(run_dir), "--learner-devices", "1", "--learner-parallel", "ddp",
                                  "--max-steps", "4"], tmp_path, token=run.token)
    assert resumed.wait(timeout=900) == 0, resumed.output()[-3000:]
    assert "step_3" in resumed.output() and "step 4/4" in resumed.output()
    assert groups_of(run_dir) == (0, 0, 4)
    assert leftovers(run.token, set())[0] == 0


@pytest.mark.slow
def test_a_killed_sharded_rank_stops_the_run_and_writes_no_partial_checkpoint(tmp_path):
    """SIGKILL rank 1: a RankError naming it, exit 1, nothing left running, and no checkpoint of a step
    whose optimizer state died with the rank: the line says so and names the one that stands."""
    args = [*PIPELINE, *FSDP, "--max-steps", "8", "--run-name", "fsdp_kill"]
    shm = shm_entries()
    run = TrainProcess(args, tmp_path)
    run.wait_for("step 3/", timeout=600)
    pid = run.rank_pid(1)
    os.kill(pid, signal.SIGKILL)
    assert run.wait(timeout=900) == 1, run.output()[-3000:]
    out = run.output()
    assert f"RankError: learner rank 1 on cpu (pid {pid}) killed by SIGKILL" in out, out[-3000:]
    assert leftovers(run.token, shm)[:2] == (0, 0)
    trained = max(int(s) for s in re.findall(r"^step (\d+)/8", out, re.M))
    saved = complete_steps(tmp_path / "fsdp_kill")
    assert saved and all(s % 2 == 0 for s in saved) and saved[-1] <= trained
    assert not list((tmp_path / "fsdp_kill" / "checkpoints").glob("*tmp*"))
    if saved[-1] < trained:  # the last completed step could not be saved: said so, with the one that stands
        why = re.search(r"\[checkpoint\] (?:step \d+ )?not written: (.*)$", out, re.M)
        assert why, out[-3000:]
        assert ("inside an optimizer step" in why[1]  # killed during the weights' gather: no step's weights
                or f"learner rank 1 killed by SIGKILL and its shard went with it; the previous checkpoint stands "
                   f"(step_{saved[-1]})" in why[1]), why[1]
