"""The messages that travel between the learner and its rollout workers (and between nodes' leaders).

As core/types.py does for episodes: each message is a plain dataclass of ints, floats, strings and
lists, so it pickles cheaply through the pipes of channel.py; no tensors travel here (weights go
through pipeline/weights.py). The learner -> worker pipe carries `Job` and `Stop`; the worker ->
learner pipe carries `Ready`, `JobDone`, `JobFailed` and `Fatal`. A worker starts with a `WorkerStart`.
"""

from dataclasses import dataclass, field

from nanorllm.core.types import RolloutResult
from nanorllm.envs.registry import EnvSpec
from nanorllm.policy.lora import LoraSpec


@dataclass(frozen=True)
class WorkerStart:
    """Learner -> worker, once, as the spawned process's argument: the run's config and the specs its assembly
    built (run/assembly.py), so a worker builds its env bundle and its replica's adapters from the same ones."""

    cfg: object  # the run's TrainConfig (its task specs resolved)
    env: EnvSpec
    lora: LoraSpec | None  # None: a full fine-tune
    pool_dir: str | None = None  # --opponent pool: the run's snapshots (rollout/opponent_pool.py)


@dataclass
class Job:
    """Learner -> worker: sample `num_samples` episodes of each task, as groups."""

    job_id: str  # "<step>.<part>": part = node x 1000 + the job's index within the step
    step: int  # the training step these episodes are for
    tasks: list[dict]  # the task records, one per group
    group_ids: list[str]  # one per task: the (task, round) group its episodes belong to
    num_samples: int  # episodes per task (the group size)
    seed: int  # the sampling seed of this job (the step's seed + 7919 x part)
    min_version: int  # the worker does not start on weights older than this (max_policy_lag)


@dataclass
class Stop:
    """Learner -> worker: finish what you are doing and exit (the stop flag in shared memory says the same)."""


@dataclass
class Ready:
    """Worker -> learner: the model is loaded, jobs can come (the learner prefers ready workers)."""

    worker_id: int
    version: int  # the weights version it loaded first
    load_s: float  # seconds that first load took
    capture_s: float = 0.0  # seconds its decode graphs took to capture (0 where there are none: the CPU)


@dataclass
class Fatal:
    """Worker -> learner: the worker stops on an exception outside a job (the learner reports it if the
    worker's restarts run out)."""

    worker_id: int
    error: str  # the worker's traceback


@dataclass
class JobTimes:
    """How a worker spent the wall time since its previous job report: the learner's pipeline/* shares."""

    wall_s: float = 0.0  # since the previous report (or the worker's start)
    idle_s: float = 0.0  # polling for a job
    weight_wait_s: float = 0.0  # waiting for the job's min_version to be published
    queue_wait_s: float = 0.0  # blocked handing the previous report to a full sender queue
    rollout_s: float = 0.0  # running this job's episodes
    load_s: float = 0.0  # loading weights (the first load too, in the first report)
    loads: int = 0  # how many loads load_s sums


@dataclass
class JobDone:
    """Worker -> learner: the episodes of one job."""

    job_id: str
    worker_id: int
    version: int  # the weights version that sampled them
    results: list[RolloutResult]  # task-major: every episode of the job's first task, then the next...
    times: JobTimes = field(default_factory=JobTimes)
    timings: dict = field(default_factory=dict)  # the engine call's counters (RolloutBatch.timings)


@dataclass
class JobFailed:
    """Worker -> learner: one job raised; the worker goes on, the learner re-issues the job elsewhere."""

    job_id: str
    worker_id: int
    version: int
    error: str  # the traceback
    times: JobTimes = field(default_factory=JobTimes)


@dataclass
class NodeShare:
    """Rank 0 -> another node's leader (several machines): that node's part of one step's tasks."""

    node: int  # the node it is for
    step: int
    picked: list[tuple[dict, str]]  # (task record, group id) pairs, as the task stream gives them


WorkerMessage = Ready | Fatal | JobDone | JobFailed  # what the worker -> learner pipe carries
