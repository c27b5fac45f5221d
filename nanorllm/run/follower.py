"""A learner rank other than 0: take a share of each step, train it, until rank 0 says the run is over.

It holds a DDP replica of the model and its own copy of the optimizer state, which stay equal to
rank 0's because every rank applies the same all-reduced gradients (under FSDP: its shard of both,
ranks/fsdp.py). Between steps rank 0 may call it into a collective of its own (`LearnerRanks.together`). It draws no tasks, writes no
logs and no checkpoints: the run's state is rank 0's. On another machine, that machine's local
rank 0 also runs its rollout workers, on the tasks rank 0 sends it. It ignores SIGINT (Ctrl-C goes to rank 0,
which saves first and then releases or ends it) and exits with rank 0: a spawned rank through its
lifeline, a torchrun rank when the agent ends the group or a collective fails.
"""

from nanorllm.pipeline.learner import PipelineSource
from nanorllm.pipeline.messages import WorkerStart
from nanorllm.ranks.group import LearnerRanks
from nanorllm.trainer.reference import reference_policy
from nanorllm.trainer.teacher import load_teacher
from nanorllm.trainer.step import train_step
from nanorllm.trainer.trainable import load_trainable
from nanorllm.trainer.update import make_optimizer
from nanorllm.utils.devices import DeviceMap, configure_threads


def follow(ranks: LearnerRanks, devices: DeviceMap | None = None) -> int:
    """Train every step rank 0 begins. With several nodes this node's leader (local rank 0) also
    runs `devices.workers` on the shares of tasks rank 0 sends it (pipeline/learner.py)."""
    start = ranks.broadcast()  # rank 0's config, after its resume and flag overrides
    cfg = start["cfg"]
    configure_threads(ranks.device, cfg.threads, start["processes"])
    policy = load_trainable(cfg, device=ranks.device, lora=start["lora"])  # rank 0's weights come in attach
    ref_policy = reference_policy(policy, cfg, ranks.device, start["reference_model"])
    teacher = load_teacher(cfg, str(ranks.device))
    optimizer = make_optimizer(policy, cfg)
    source, remote = None, ranks.nodes > 1 and not cfg.serial
    if remote and ranks.local_rank == 0:  # this node's workers, fed by rank 0
        # Version -1 until rank 0's weights are here (attach): no job starts before. It takes its first
        # shares of tasks from rank 0 now; it stops when rank 0 does.
        source = PipelineSource(WorkerStart(cfg, start["env_spec"], start["lora"]), policy, optimizer, stream=None,
                                workers=devices.workers, ranks=ranks, start_step=-1, stop=lambda: False, draws=False)
    elif remote:
        ranks.broadcast()  # the first shares of tasks: for the nodes' leaders
    ranks.parallel = cfg.learner_parallel
    ranks.attach(policy, optimizer)  # rank 0's weights and optimizer state
    if source is not None:
        source.weights.publish(start["start_step"])  # the workers start from rank 0's weights
    try:
        while (step := ranks.begin()) is not None:
            if callable(step):  # not a step: a collective rank 0 runs between steps (LearnerRanks.together)
                step(policy, optimizer, ranks)
                continue
            if source is not None:
                source.next_batch(step)  # this node's episodes of the step, sent to rank 0 in there
            elif remote:
                ranks.gather([])
            share = ranks.receive()
            if share is None:  # rank 0 stopped before training this step
                continue
            policy.version = share["version"]
            train_step(policy, optimizer, share["results"], cfg, ref_policy=ref_policy, teacher=teacher, ranks=ranks)
            if source is not None:
                source.after_update(step)  # publishes the new weights here, takes the next shares
            elif remote:
                ranks.broadcast()
    finally:
        if source is not None:
            source.close()
    return 0
