"""A run assembled once: its env bundle, its tasks, its devices and its LoRA spec, built from the config one
time, before any model loads, and handed as `RunParts` to the memory plan, `TrainingRun.setup` and (as
specs) the workers' start message.

What goes wrong here is bad input (exit 2, nothing written): an env or agent that does not import, a task
source that does not load or leaves no training task, devices that do not exist.
"""

import sys
from dataclasses import replace

from nanorllm.config import TrainConfig
from nanorllm.config.specs import env_spec, lora_spec, run_bundle
from nanorllm.datasets.tasks import OVERLAP_RULE, TaskFileError, check_task_rows, overlap_counts, remove_overlap
from nanorllm.envs.base import EnvBundle
from nanorllm.envs.registry import load_env_tasks, resolve_task_specs
from nanorllm.ranks.group import learner_spec
from nanorllm.trainer import fingerprint
from nanorllm.trainer.parts import RunParts
from nanorllm.utils.devices import DeviceMap, resolve_devices
from nanorllm.utils.precision import choose_precision


def run_devices(cfg: TrainConfig) -> DeviceMap:
    """The learner's, the learner ranks' and the workers' devices of `cfg` (DeviceError when they do not exist)."""
    return resolve_devices(cfg.devices, cfg.num_workers, serial=cfg.serial, learner_spec=learner_spec(cfg))


def assemble(cfg: TrainConfig, *, env: EnvBundle | None = None) -> RunParts:
    """Everything of the run that needs no model: `cfg`'s env (built once: `env`, the bundle the command line's
    checks built, or here), its tasks (loaded once; the whole held-out set removed from training, whatever
    --eval-limit, which limits only the tasks evaluated), its devices, its compute dtype (--dtype auto chosen for
    them) and its LoRA spec."""
    spec = env_spec(cfg)
    env = run_bundle(cfg, env)
    tasks, eval_tasks = resolve_task_specs(cfg.tasks, cfg.eval_tasks, env)
    devices = run_devices(cfg)
    precision = choose_precision(cfg.dtype, [*devices.learners, *devices.workers])
    cfg = replace(cfg, tasks=tasks, eval_tasks=eval_tasks, dtype=precision.name)  # config.json records what was chosen
    loaded = check_task_rows(env_tasks(env, tasks, cfg.limit), tasks)
    heldout = check_task_rows(env_tasks(env, eval_tasks, None), eval_tasks) if eval_tasks else []
    train, dropped = remove_overlap(loaded, heldout)
    if not train:
        raise TaskFileError(tasks, [f"{tasks}: no training tasks left after removing the {dropped} that are also "
                                    f"held out (--eval-tasks {eval_tasks}; {overlap_counts(loaded, heldout)}: "
                                    f"{OVERLAP_RULE})"])
    if dropped > len(loaded) // 2:
        print(f"[tasks] warning: {dropped} of {len(loaded)} training tasks are also held out and were removed "
              f"({overlap_counts(loaded, heldout)}; {OVERLAP_RULE})", file=sys.stderr, flush=True)
    kept = {id(t) for t in train}
    order = fingerprint.task_order(loaded, [t for t in loaded if id(t) not in kept], cfg.seed)
    return RunParts(cfg=cfg, env_spec=spec, env=env, lora=lora_spec(cfg), devices=devices,
                    train_tasks=train, eval_tasks=heldout[:cfg.eval_limit], eval_sets=eval_sets(cfg, env),
                    dropped_heldout=dropped, task_order=order, precision=precision.why)


def eval_sets(cfg: TrainConfig, env: EnvBundle) -> dict[str, list[dict]]:
    """{name: tasks} of each --eval-set name=spec (at most --eval-limit tasks each)."""
    sets = {}
    for item in cfg.eval_set:
        name, _, spec = item.partition("=")
        sets[name] = check_task_rows(env_tasks(env, spec, cfg.eval_limit), spec)
    return sets


def env_tasks(env: EnvBundle, spec: str, limit: int | None) -> list[dict]:
    """`env.load_tasks(spec)` (envs/registry.py load_env_tasks); whatever it raises is bad input (TaskFileError
    naming the env and the spec)."""
    try:
        return load_env_tasks(env, spec, limit)
    except TaskFileError:
        raise
    except Exception as e:
        raise TaskFileError(spec, [f"{spec}: the env {env.spec}'s load_tasks raised {type(e).__name__}: {e}"]) from e
