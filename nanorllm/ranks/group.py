"""LearnerRanks: the learner as N data-parallel ranks of one torch.distributed process group.

One learner process on one device is the bottleneck where users have the most hardware (seven
rollout GPUs feeding one learner GPU). So the learner may run as N ranks of one process group
(NCCL on GPU, gloo on CPU), each holding a DistributedDataParallel replica of the model:

- rank 0 is the launcher's process: it alone draws tasks, talks to its workers, logs, evaluates
  and checkpoints. DDP replicas are identical after every step, so rank 0 holds the whole state
  and checkpoints stay plain HF directories that any number of ranks can resume from.
- every step rank 0 cuts the step's episodes into one share per rank, groups kept whole
  (ranks/split.py), and sends each rank its share with one `scatter_object_list`; a `None` share
  tells the other ranks the run is over. Every rank trains its share (run/follower.py).
- the loss normaliser is global: train_step all-reduces the step's token and sample counts before
  the loss, and multiplies each rank's loss by the world size because DDP averages gradients. An
  N-rank step is then the 1-rank step on the same batch (tests/test_ranks.py holds them within 1e-5).
  The clip norm is the global one, since DDP's gradients are already reduced.

Ranks start one of two ways: under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR/PORT set, every process ran launch/train.py), or, with `--learner-devices` naming N > 1
devices and no torchrun, rank 0 starts ranks 1..N-1 itself (utils/children.py, TCP on localhost); both in run/ranks.py.
With one rank there is no process group and nothing here does anything.

With `--learner-parallel fsdp` the ranks hold shards of the model and its optimizer state instead
of replicas (ranks/fsdp.py); rank 0 still holds the full weights, but the optimizer state exists only
in shards, so saving it is a collective that rank 0 calls the other ranks into (`together`).

Faults: every collective carries the process group's timeout (`--learner-timeout-s`), so a hung
rank stops the run instead of hanging it; a dead rank breaks the next collective at once (its
connections close). `check` turns that into one clear error naming the rank and how it ended;
the run then saves the last completed step like after any other error (under FSDP it cannot: the
dead rank's shard of the optimizer state is gone, and `optimizer_state` says so instead). Spawned ranks die with rank
0 (utils/lifeline.py) and `close` ends them; under torchrun the agent ends the others.
"""

import contextlib
import datetime
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from nanorllm.ranks.split import split_groups
from nanorllm.utils.procs import exit_reason, is_stopped


NO_LIMIT_S = 365 * 24 * 3600.0  # what an `inf` timeout becomes: timedelta and the C++ side take no infinity


# The process groups of runs that ended without `release` (a rank died or hung, or the run stopped inside a
# step). Such a group's worker threads may still be finishing a failed collective, and that ends with taking the
# interpreter lock; freeing the group joins them, and the freeing thread holds that lock: the process would hang
# as it returns. Kept here, a group is never freed: its threads finish and idle until the process exits (the
# launchers end through utils/quick_exit.py, before the interpreter's teardown would free it).
_NEVER_FREED: list = []


def _timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=min(seconds, NO_LIMIT_S))


class RankError(RuntimeError):
    """A learner rank died or stopped answering; the message names it."""


class ShardsUnavailable(RuntimeError):
    """The sharded optimizer state cannot be gathered now; the message says why."""


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def learner_spec(cfg) -> str | None:
    """--learner-devices, or under torchrun as many ranks as torchrun started on this node."""
    return cfg.learner_devices or (os.environ.get("LOCAL_WORLD_SIZE") if under_torchrun() else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def where_line(where: list[tuple[str, int, str]]) -> str:
    """`attach`'s answer as the run prints it (the fault suite reads each rank's pid from it)."""
    return f"[ranks] {len(where)} learner ranks: " + ", ".join(
        f"rank {r} on {host} {device} pid {pid}" for r, (host, pid, device) in enumerate(where))


class LearnerRanks:
    def __init__(self, *, rank: int = 0, world: int = 1, local_rank: int = 0, local_world: int = 1,
                 device: str = "cpu", parallel: str = "ddp"):
        self.rank, self.world, self.device, self.parallel = rank, world, device, parallel
        self.local_rank, self.local_world = local_rank, local_world
        self.procs: dict[int, mp.Process] = {}  # ranks this process spawned
        self.devices: dict[int, str] = {rank: device}
        self.released = False  # rank 0 told the other ranks the run is over
        self.in_step = False  # rank 0 began a step and has not yet sent its shares
        self.timeout_s: float | None = None  # every collective's limit once started (init)
        self.started = False  # the first step's shares went out: the start's longer limit is over
        self.training = False  # rank 0 sent the shares and has not finished the step
        self.lost: str | None = None  # why a rank is gone (set with the RankError)

    # ---- start and stop ------------------------------------------------------------------------
    def init(self, address: str, timeout_s: float, start_timeout_s: float = 0.0) -> None:
        self.timeout_s = timeout_s
        if self.device.startswith("cuda"):
            torch.cuda.set_device(self.device)  # NCCL and object collectives use the current device
        dist.init_process_group("nccl" if self.device.startswith("cuda") else "gloo", init_method=address,
                                rank=self.rank, world_size=self.world,
                                timeout=_timedelta(max(timeout_s, start_timeout_s)))

    def close(self, grace_s: float = 5.0) -> None:
        """End the ranks this process spawned (after `release` they exit by themselves; otherwise they
        hold nothing worth waiting for), then the group."""
        deadline = time.monotonic() + (grace_s if self.released else 0.0)
        for p in self.procs.values():
            p.join(timeout=max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self.procs.clear()
        if dist.is_initialized():
            if not self.released:
                _NEVER_FREED.append(dist.group.WORLD)
            dist.destroy_process_group()

    # ---- the model -----------------------------------------------------------------------------
    def attach(self, policy, optimizer: torch.optim.Optimizer) -> list[tuple[str, int, str]]:
        """Wrap the model in DDP (rank 0's weights reach every rank) or shard it (FSDP, from rank 0's
        weights) and give every rank rank 0's optimizer state (a resumed run's, or a fresh one with
        its learning rate). Returns every rank's (host, pid, device); [] with one rank."""
        if self.world == 1:
            return []
        if self.parallel == "fsdp":
            from nanorllm.ranks.fsdp import shard

            shard(policy, optimizer, self)
            return self._where()
        from torch.nn.parallel import DistributedDataParallel

        # No buffer sync in forward: a rank's forward count varies with its share (a collective there
        # would pair up wrong), and the rotary buffers are computed, not trained.
        kw = {"device_ids": [torch.device(self.device)]} if self.device.startswith("cuda") else {}
        policy.train_module = DistributedDataParallel(policy.model, forward_sync_buffers=False, **kw)
        state = [optimizer.state_dict() if self.rank == 0 else None]
        dist.broadcast_object_list(state, src=0)
        if self.rank:
            optimizer.load_state_dict(state[0])
        return self._where()

    def _where(self) -> list[tuple[str, int, str]]:
        where = [None] * self.world
        dist.all_gather_object(where, (socket.gethostname(), os.getpid(), self.device))
        return where

    def accumulating(self, policy, *, last: bool):
        """DDP: gradients of a micro-batch that is not this rank's last stay local (one all-reduce a
        step). FSDP reduce-scatters every micro-batch's: a rank then never holds a full gradient."""
        if self.world == 1 or last or self.parallel == "fsdp":
            return contextlib.nullcontext()
        return policy.train_module.no_sync()

    def passes(self, policy, chunks: list, *, proximal: bool):
        """This rank's micro-batches to train, each yielded inside its gradient accumulation (DDP: the all-reduce
        at the rank's last), then the idle passes (`idle_backward`) that give every rank the same collectives."""
        runs = self.micro_batch_count(len(chunks))
        for i in range(runs):
            with self.accumulating(policy, last=i == runs - 1):
                if i < len(chunks):
                    yield chunks[i]
                else:
                    self.idle_backward(policy, proximal=proximal)

    def backward(self, loss: torch.Tensor) -> None:
        """A micro-batch's backward as a part of the whole step's sum: DDP and FSDP average the ranks' gradients,
        and the step's normaliser already counts every rank's tokens, so each rank's loss is scaled by the world."""
        (loss * self.world).backward()

    def micro_batch_count(self, n: int) -> int:
        """Micro-batches this rank runs when it has `n` to train: under DDP at least one (a rank with
        nothing still joins the gradient all-reduce), under FSDP as many as any rank has (every
        forward and backward is a collective). Those past `n` are idle (`idle_backward`)."""
        if self.world == 1:
            return n
        return int(self.all_max(n)) if self.parallel == "fsdp" else max(n, 1)

    def idle_backward(self, policy, *, proximal: bool = False) -> None:
        """A micro-batch with nothing to train, with the collectives of a real one: a zero gradient,
        after the no-grad proximal forward when real micro-batches run one."""
        if proximal:
            with torch.no_grad():
                self.idle_forward(policy)
        (self.idle_forward(policy).logits.sum() * 0.0).backward()

    @staticmethod
    def idle_forward(policy):
        """A forward of nothing: two pad tokens, one scored position, nothing shared (no count read from
        the device). Under FSDP a rank with no real pass left runs it to join the others' collectives."""
        ids = torch.full((1, 2), policy.pad_id, dtype=torch.long, device=policy.device)
        positions = torch.zeros((1, 2), dtype=torch.long, device=policy.device)  # one scored position: (0, 0)
        return policy.forward(ids, torch.ones_like(ids), positions, 0)

    def reshard(self, policy) -> None:
        """After forwards with no backward (a held-out loss): under FSDP the root's parameters go back to their
        shards. FSDP leaves the root's gathered after a forward, for the backward that would follow; with none,
        the model would keep them, and name other tensors than the optimizer's."""
        if self.world > 1 and self.parallel == "fsdp":
            policy.train_module.reshard()

    def updated(self, policy) -> dict:
        """After an optimizer step: under FSDP every rank gathers the new weights (rank 0 into the full
        model the workers read); returns its metric."""
        if self.world == 1 or self.parallel != "fsdp":
            return {}
        from nanorllm.ranks.fsdp import gather_weights

        return {"perf/gather_s": gather_weights(policy)}

    def optimizer_state(self, policy, optimizer: torch.optim.Optimizer) -> dict:
        """Rank 0: the full, plain optimizer state_dict, whatever the number of ranks. Under FSDP it
        lies in shards and gathering it needs every rank between two steps; raises ShardsUnavailable
        when they cannot all join (a rank died, or rank 0 stopped inside an update)."""
        if self.world == 1 or self.parallel != "fsdp":
            return optimizer.state_dict()
        if self.lost or self.released or self.training or (self.in_step and self.nodes > 1):
            why = self.lost or ("the other learner ranks have exited" if self.released else
                                "rank 0 stopped inside a step, while the other ranks were in its collectives")
            raise ShardsUnavailable(f"the optimizer state is sharded over the learner ranks (--learner-parallel "
                                    f"fsdp) and cannot be gathered: {why}")
        if self.in_step:  # the others wait for this step's shares: none come, they go back to `begin`
            self._scatter([None] * self.world)
            self.in_step = False
        from nanorllm.ranks.fsdp import full_optimizer_state

        return self.together(full_optimizer_state, policy, optimizer)

    def together(self, fn, policy, optimizer):
        """Rank 0, between steps: every rank runs fn(policy, optimizer, ranks) at once, for collectives
        outside a step (gathering the optimizer state for a checkpoint). The other ranks, waiting
        in `begin`, get `fn` (a module-level function) instead of a step (run/follower.py)."""
        self.begin(fn)
        return fn(policy, optimizer, self)

    # ---- the step ------------------------------------------------------------------------------
    def all_sum(self, values: dict[str, float]) -> dict[str, float]:
        if self.world == 1:
            return values
        t = torch.tensor(list(values.values()), dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(t)
        return dict(zip(values, t.tolist()))

    def reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Every rank's `t` summed (or, op="max", the largest), as a tensor where `t` is: no host
        synchronisation on the way (the caller makes numbers once, when it needs them)."""
        if self.world == 1:
            return t
        t = t.to(self._comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return t

    def all_max(self, value: float) -> float:
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    @property
    def nodes(self) -> int:
        return self.world // self.local_world

    @property
    def node(self) -> int:
        return self.rank // self.local_world

    def _comm_device(self) -> str:
        return self.device if self.device.startswith("cuda") else "cpu"

    def begin(self, step=None):
        """Rank 0: every rank learns the step that starts now (None: the run is over; a function: a
        collective to run together, see `together`). Others: returns it."""
        if self.world == 1:
            return step
        step = self.broadcast(step)
        self.in_step = self.rank == 0 and isinstance(step, int)
        return step

    def share(self, results: list, version: int, split=split_groups) -> list:
        """Rank 0: send every rank its share of the step (`split`: RL's groups whole, or SFT's rows,
        ranks/split.py); returns rank 0's own."""
        if self.world == 1:
            return results
        self.in_step, self.training = False, True
        shares = [{"version": version, "results": s} for s in split(results, self.world)]
        return self._scatter(shares)["results"]

    def release(self) -> None:
        """Rank 0, after its last step: the other ranks stop. A run stopped inside a step cannot
        release them (they wait in that step's collectives); `close` ends them instead."""
        if self.world > 1 and not self.in_step:
            self.begin(None)
            self.released = True

    def receive(self) -> dict | None:
        """Another rank: its share of the step ({"version", "results"}); None: rank 0 abandoned the step."""
        return self._scatter(None)

    def _scatter(self, items: list | None):
        out = [None]
        dist.scatter_object_list(out, items, src=0)
        if not self.started:  # the first step's shares are out: every process has started, workers too
            dist.distributed_c10d._set_pg_timeout(_timedelta(self.timeout_s))
            self.started = True
        return out[0]

    def gather(self, results: list) -> list[list] | None:
        """Every node's episodes of the step: rank 0 gets each rank's list, the others None."""
        out = [None] * self.world if self.rank == 0 else None
        dist.gather_object(results, out, dst=0)
        return out

    def broadcast(self, obj=None):
        """Rank 0's `obj` on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    # ---- faults --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def guarded(self):
        """Rank 0's step, from `begin` to the update: an error of any collective in it (a rank that
        died while rank 0 waited in `begin`, `share` or the gradient all-reduce) becomes one RankError."""
        try:
            yield
        except Exception as e:
            self.check(e)
            raise
        self.training = False  # the step's collectives are over (or it never sent its shares)

    def check(self, error: BaseException, wait_s: float = 2.0) -> None:
        """After a failed step: raise a RankError naming the rank that died or stopped answering.
        Returns when the error is not the process group's (it is then the caller's to raise)."""
        if self.world == 1:
            return
        comm = isinstance(error, dist.DistError) or any(k in str(error).lower() for k in ("gloo", "nccl"))
        deadline = time.monotonic() + (wait_s if comm else 0.0)  # a closed connection is seen before the exit
        while self.procs and all(p.exitcode is None for p in self.procs.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        for r, p in self.procs.items():
            if p.exitcode is not None:
                self.lost = f"learner rank {r} {exit_reason(p.exitcode)} and its shard went with it"
                raise RankError(f"learner rank {r} on {self.devices[r]} (pid {p.pid}) {exit_reason(p.exitcode)}; "
                                f"the run cannot go on without its share of the batch") from error
        if not comm:
            return
        self.lost = "another learner rank died or stopped answering, and its shard went with it"
        for r, p in self.procs.items():
            if is_stopped(p.pid):
                raise RankError(f"learner rank {r} on {self.devices[r]} (pid {p.pid}) is stopped (SIGSTOP or a "
                                f"debugger) and did not answer within --learner-timeout-s {self.timeout_s:g}") from error
        raise RankError(f"learner rank {self.rank}: another learner rank died or did not answer within "
                        f"--learner-timeout-s {self.timeout_s:g} ({type(error).__name__}: "
                        f"{str(error).splitlines()[0] if str(error) else ''})") from error


ONE_RANK = LearnerRanks()  # the learner alone: no process group, every collective is the identity
