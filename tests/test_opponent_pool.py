"""`--opponent pool` (rollout/opponent_pool.py): which snapshots a rollout draws from, which one each game meets,
what the learner keeps on disk, the pool's models in a process, the games against it, the refusals; training runs
(serial, pipeline, resume) are `slow`."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import ScriptedPolicy
from nanorllm.policy.base import SamplingParams
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.rollout.opponent_pool import (OpponentPool, drop_after, kept_steps, pick, pool_steps, prune,
                                            snapshot_steps)
from nanorllm.run.lifecycle import main
from nanorllm.trainer.metrics import selfplay_metrics
from tests.procs import read_rollouts, run_train
from tests.runs import TINY_ARGS
from tests.test_selfplay import DUEL, DUEL_RUN, duel


def test_a_rollout_draws_from_the_last_pool_size_snapshots_up_to_its_version():
    assert pool_steps(0, 4, 3) == [0]  # --model alone
    assert pool_steps(3, 4, 3) == [0]
    assert pool_steps(4, 4, 3) == [0, 4]
    assert pool_steps(11, 4, 3) == [0, 4, 8]
    assert pool_steps(12, 4, 3) == [4, 8, 12]  # the oldest left
    assert pool_steps(13, 1, 2) == [12, 13]


def test_the_learner_keeps_what_a_lagging_worker_or_a_resume_may_still_ask_for():
    assert kept_steps(12, lag=0, checkpoints=[], every=4, size=2) == {8, 12}
    assert kept_steps(12, lag=1, checkpoints=[], every=4, size=2) == {4, 8, 12}  # version 11's pool: 4, 8
    assert kept_steps(12, lag=0, checkpoints=[5], every=4, size=2) == {0, 4, 8, 12}  # a resume at 5 draws 0, 4
    # every checkpoint kept on disk: a resume falls back to an older one where the newest does not load
    assert kept_steps(20, lag=0, checkpoints=[5, 10], every=4, size=2) == {0, 4, 8, 16, 20}


def test_each_game_meets_the_snapshot_its_group_and_index_pick_and_every_snapshot_plays():
    picks = [pick(3, f"t{i}@{i}", k) for i in range(40) for k in range(4)]
    assert picks == [pick(3, f"t{i}@{i}", k) for i in range(40) for k in range(4)]  # no state, no order
    assert set(picks) == {0, 1, 2} and max(picks.count(m) for m in range(3)) < 0.5 * len(picks)


def _snapshots(folder: Path, *steps: int) -> None:
    for s in steps:
        (folder / f"step_{s}").mkdir(parents=True)
        (folder / f"step_{s}" / "config.json").write_text("{}")


def test_a_process_holds_the_current_pools_models_loading_each_once_and_dropping_the_ones_that_left(tmp_path):
    loads = []
    pool = OpponentPool(tmp_path, base="base-model", every=2, size=2, load=lambda name: loads.append(name) or name)
    assert pool.members(1) == [(0, "base-model")]
    _snapshots(tmp_path, 2, 4)
    assert [s for s, _ in pool.members(3)] == [0, 2] and pool.members(3)[1][1] == str(tmp_path / "step_2")
    assert [s for s, _ in pool.members(5)] == [2, 4]
    assert loads == ["base-model", str(tmp_path / "step_2"), str(tmp_path / "step_4")]  # each loaded once
    assert set(pool.loaded) == {2, 4}  # the base left the pool: dropped
    with pytest.raises(FileNotFoundError, match="step_6 is missing"):
        pool.members(6)


def test_pruning_keeps_the_asked_snapshots_and_a_resume_drops_the_stopped_runs_future(tmp_path):
    _snapshots(tmp_path, 2, 4, 6, 8)
    (tmp_path / "step_10.tmp").mkdir()  # a write the crash cut
    assert prune(tmp_path, {4, 6, 8}) == [2]
    assert snapshot_steps(tmp_path) == [4, 6, 8] and not (tmp_path / "step_10.tmp").exists()
    assert drop_after(tmp_path, 5) == [6, 8] and snapshot_steps(tmp_path) == [4]
    assert snapshot_steps(tmp_path / "none") == []


class FixedPool:
    """Two scripted snapshots: the old one takes 1 stone, the new one 2."""

    def __init__(self):
        self.old, self.new = ScriptedPolicy(lambda c, r, m: "1"), ScriptedPolicy(lambda c, r, m: "2")
        self.asked = []

    def members(self, version):
        self.asked.append(version)
        return [(0, self.old), (4, self.new)]


def test_each_game_is_played_against_its_picked_snapshot_and_records_it():
    policy, pool = ScriptedPolicy(lambda c, r, m: "1"), FixedPool()
    policy.version = 5
    engine = RolloutEngine(policy, sampling=SamplingParams(), env=duel(max_turns=8), opponent="pool",
                           opponent_policy=pool)
    tasks = [{"task_id": f"heap{h}", "heap": h, "game": "nim"} for h in (7, 8, 9)]
    results = engine.run(tasks, num_samples=4, group_ids=[f"heap{h}@{i}" for i, h in enumerate((7, 8, 9))],
                         seed=3).results
    assert pool.asked == [5]  # the pool of the policy's version
    assert len(results) == 12 and {r.opponent for r in results} == {"pool:step_0", "pool:step_4"}
    for r in results:
        k = int(r.step_samples[0].episode_id.split("#")[1].split("/")[0])  # <group>#<k>/seat<s>
        assert r.opponent == f"pool:step_{(0, 4)[pick(2, r.group_id, k)]}"
        took = 1 if r.opponent == "pool:step_0" else 2  # the stones the opponent took between the policy's turns
        counts = [int(s.observation.split()[4]) for s in r.trajectory.steps]
        assert all(b == a - 1 - took for a, b in zip(counts, counts[1:]))
    assert pool.old.seeds and pool.new.seeds and pool.old.seeds != pool.new.seeds  # each its own stream
    m = selfplay_metrics(results)
    for age, name in enumerate(["pool:step_4", "pool:step_0"]):  # newest first
        mine = [r for r in results if r.opponent == name]
        assert m[f"selfplay/win_rate/vs_pool{age}"] == sum(r.reward > 0 for r in mine) / len(mine)
    with pytest.raises(ValueError, match="snapshot pool"):
        RolloutEngine(policy, sampling=SamplingParams(), env=duel(), opponent="pool")


def test_the_memory_plan_counts_the_pools_snapshots_where_rollouts_run():
    from nanorllm.config import TrainConfig
    from nanorllm.memory.plan import plan_run
    from nanorllm.run.assembly import assemble
    from nanorllm.utils.devices import DeviceMap

    def opponent_bytes(**kw):
        parts = assemble(TrainConfig(model="tiny-random", env=DUEL, eval_opponent="random", **kw))
        parts.devices = DeviceMap(learners=["cpu"], workers=["cpu"])
        worker = [p for p in plan_run(parts, free={"cpu": 10**12}).processes if p.name == "worker 0"][0]
        return sum(part.nbytes for part in worker.parts if part.name == "opponent")

    one = opponent_bytes(opponent="tiny-random")
    assert one > 0 and opponent_bytes(opponent="pool", pool_size=3) == 3 * one


@pytest.mark.parametrize("args, said", [
    (["--env", DUEL, "--eval-opponent", "pool"], "eval_opponent: 'pool' is the training policy's own snapshots"),
    (["--env", DUEL, "--opponent", "pool", "--pool-every", "0"], "pool_every: must be >= 1, got 0"),
    (["--env", DUEL, "--opponent", "pool", "--pool-size", "0"], "pool_size: must be >= 1, got 0"),
    (["--opponent", "pool"], "one-player env")])
def test_a_pool_setting_that_cannot_work_is_refused_at_start(tmp_path, capsys, args, said):
    assert main([*TINY_ARGS, "--serial", *args, "--output-dir", str(tmp_path)]) == 2
    assert said in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written


def test_launch_eval_refuses_the_pool_as_its_opponent():
    from nanorllm.trainer.eval_model import EvalConfig, evaluate_model

    with pytest.raises(ValueError, match="'pool' is the training policy's own snapshots"):
        evaluate_model(EvalConfig(model="tiny-random", env=DUEL, eval_opponent="pool", eval_limit=1))


POOL_RUN = [*DUEL_RUN, "--opponent", "pool", "--pool-every", "1", "--pool-size", "2", "--eval-opponent", "random",
            "--no-drop-zero-std-groups"]


@pytest.mark.slow
def test_a_serial_pool_run_plays_its_snapshots_and_a_resumed_one_ends_with_the_uninterrupted_ones_weights(tmp_path):
    common = [*TINY_ARGS, *POOL_RUN, "--serial", "--save-every", "1", "--seed", "2"]
    assert main([*common, "--output-dir", str(tmp_path), "--run-name", "full", "--max-steps", "4"]) == 0
    assert main([*common, "--output-dir", str(tmp_path), "--run-name", "part", "--max-steps", "2"]) == 0
    (tmp_path / "part" / "pool" / "step_9").mkdir()  # as if the stopped run had got further
    assert main(["--resume", str(tmp_path / "part"), "--max-steps", "4"]) == 0
    full = read_rollouts(tmp_path / "full")
    by_step = {s: {e["opponent"] for e in full if e["step"] == s} for s in range(1, 5)}
    assert by_step[1] == {"pool:step_0"} and by_step[4] <= {"pool:step_2", "pool:step_3"} and by_step[4]
    # version 4's pool, and the pools of the checkpoints on disk then, 1-3 (step 4's is written after the snapshot)
    kept = ["step_1", "step_2", "step_3", "step_4"]
    assert sorted(p.name for p in (tmp_path / "full" / "pool").iterdir()) == kept
    assert sorted(p.name for p in (tmp_path / "part" / "pool").iterdir()) == kept
    key = lambda e: (e["step"], e["group_id"], e["seat"])  # noqa: E731
    assert [(e["opponent"], e["final_reward"]) for e in sorted(full, key=key)] == \
           [(e["opponent"], e["final_reward"]) for e in sorted(read_rollouts(tmp_path / "part"), key=key)]
    a, b = (load_file(str(tmp_path / r / "checkpoints" / "step_4" / "model" / "model.safetensors"))
            for r in ("full", "part"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_resume_that_falls_back_to_an_older_checkpoint_finds_that_checkpoints_pool(tmp_path, capsys):
    args = [*TINY_ARGS, *POOL_RUN, "--pool-size", "1", "--serial", "--save-every", "1", "--seed", "2",
            "--output-dir", str(tmp_path), "--run-name", "r"]
    assert main([*args, "--max-steps", "3"]) == 0
    run = tmp_path / "r"
    for newest in ("step_3", "step_2"):  # the two newest do not load: the resume starts from step 1's
        (run / "checkpoints" / newest / "trainer_state.json").write_text("{cut short")
    assert main(["--resume", str(run), "--max-steps", "3"]) == 0
    assert "[resume] from" in capsys.readouterr().out
    replayed = [e for e in read_rollouts(run) if e["step"] == 2]
    assert replayed and {e["opponent"] for e in replayed} == {"pool:step_1"}  # version 1's pool, kept for it


@pytest.mark.slow
def test_a_pipelined_pool_run_trains_against_the_snapshots_its_workers_load(tmp_path):
    rc, out, _ = run_train([*POOL_RUN, "--num-workers", "1", "--max-steps", "3", "--run-name", "p"], tmp_path)
    assert rc == 0, out
    episodes = read_rollouts(tmp_path / "p")
    assert {e["opponent"] for e in episodes} >= {"pool:step_0", "pool:step_1"}
    assert all(int(e["opponent"].split("_")[1]) <= e["policy_version"] for e in episodes)
    assert sorted(p.name for p in (tmp_path / "p" / "pool").iterdir()) == ["step_1", "step_2", "step_3"]

