"""verifiers environments as an env: `--env verifiers:MODULE[:LOADER]` (the adapter of envs/registry.py).

verifiers' own rollout and scoring code plays every episode, against the rollout worker's OpenAI-compatible endpoint
(rollout/endpoint.py), as an `--agent` episode is played: the episode is an agent function (envs/agent_fn.py) that
runs `Env.run_episode` on one task, so the engine trains on exactly the token ids it sampled, one row per history
that extends (rollout/agent_runner.py). The episode's reward is its traces' rewards (verifiers' weighted sum of the
task's `@vf.reward` functions, judges and the env's own `record_reward`); each named reward and `@vf.metric` is
logged as `verifiers/reward/NAME` and `verifiers/metric/NAME`. An episode verifiers marks failed (a reward or
metric that raised, a harness error, a timeout) or whose reward is not a finite number is an env error: counted
in `rollout/env_errors`, its group goes on without it.

The env: `MODULE.LOADER(**env_args)` (default `load_environment`) returning a `verifiers.v1.Env`; for a module
with no `load_environment` of its own (a verifiers taskset package), verifiers' own `load_environment` on the
config `{"taskset": {"id": MODULE, **env_args}}`. `--env-arg key=value` is typed by the loader's defaults
(the taskset config's fields). A seat that pins no harness is played by the in-process chat harness
(envs/verifiers_harness.py) and a seat that names no runtime runs on the local subprocess runtime: verifiers'
defaults (its `bash` harness, a Prime sandbox) need the package index and a remote service at every rollout.
For the same reason the env's code installs nothing from the package index mid-run: UV_OFFLINE=1 and
PIP_NO_INDEX=1 are set for every process that plays its episodes (a reward that shells out to `uv` or pip gets
what is cached, or fails that episode as an env error), unless the run's environment sets them itself
(`UV_OFFLINE=0 PIP_NO_INDEX=0` lets it install).

Tasks are the taskset's: `vf:train`, `vf:eval` or `vf:all`, with `,size=N` to read only the first N tasks (an
infinite taskset needs it). verifiers 0.4.0 tasksets have no held-out split of their own, so `vf:eval` is the tasks
whose key (verifiers' content hash) falls in one tenth of the hash space and `vf:train` the rest: disjoint by
construction, the same split whatever the order or the size read. A row carries the task's data as JSON (`vf_data`);
a worker rebuilds the task from it with the taskset's task class.
"""

import hashlib
import importlib
import inspect
import itertools
import math
import os
from typing import ClassVar

from nanorllm.core.types import RolloutResult
from nanorllm.envs.agent_fn import AgentBundle
from nanorllm.utils.modules import EnvSpecError

PREFIX = "vf:"
SPLITS = ("train", "eval", "all")
EVAL_SHARE = 10  # one task in this many (by key) is held out
TOKEN_VAR = "NANORLLM_VERIFIERS_API_KEY"  # verifiers reads its client's key from the environment by name
MODEL_NAME = "policy"
OFFLINE = {"UV_OFFLINE": "1", "PIP_NO_INDEX": "1"}  # the env's code installs nothing from the package index


def held_out(key: str) -> bool:
    return int(hashlib.sha1(key.encode()).hexdigest(), 16) % EVAL_SHARE == 0


def parse_split(spec: str) -> tuple[str, int | None]:
    """(split, size or None) of `vf:SPLIT[,size=N]`."""
    head, _, rest = spec.partition(",")
    split = head[len(PREFIX):] if head.startswith(PREFIX) else ""
    size = None
    if rest:
        key, sep, value = rest.partition("=")
        if key.strip() != "size" or not sep or not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"{spec!r}: expected vf:SPLIT,size=N with N >= 1")
        size = int(value)
    if split not in SPLITS:
        raise ValueError(f"{spec!r}: verifiers tasks are vf:train, vf:eval or vf:all (optionally ,size=N)")
    return split, size


def _loader(target: str):
    """(module name, the loader function, or None for verifiers' own) of MODULE[:LOADER]."""
    spec = f"verifiers:{target}"
    name, _, loader_name = target.partition(":")
    if not name or "/" in name or name.endswith(".py"):
        raise EnvSpecError(f"{spec!r}: expected verifiers:MODULE[:LOADER], MODULE an importable module name")
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        raise EnvSpecError(f"{spec!r}: no module {e.name!r} (is the environment installed, or on the path?)") from None
    except (Exception, SystemExit) as e:  # a module that exits while importing is refused like one that raises
        raise EnvSpecError(f"{spec!r}: cannot import {name!r}: {type(e).__name__}: {e}") from e
    fn = getattr(module, loader_name or "load_environment", None)
    if loader_name and not callable(fn):
        raise EnvSpecError(f"{spec!r}: {name!r} has no function {loader_name!r}")
    if fn is None and not _is_taskset_package(module):
        raise EnvSpecError(f"{spec!r}: {name!r} has no load_environment and exports no verifiers Taskset "
                           "(verifiers.v1.Taskset in its __all__)")
    return name, fn


def _is_taskset_package(module) -> bool:
    import verifiers.v1 as vf

    return any(isinstance(obj, type) and issubclass(obj, vf.Taskset) and obj is not vf.Taskset
               for obj in (getattr(module, n, None) for n in getattr(module, "__all__", ())))


def loader_args(target: str) -> dict:
    """The env's options and their defaults: the loader's keyword parameters, or the taskset config's fields."""
    name, fn = _loader(target)
    if fn is not None:
        params = inspect.signature(fn).parameters.values()
        return {p.name: None if p.default is p.empty else p.default for p in params
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    from verifiers.v1.utils.loaders import taskset_config_type

    skip = {"id", "task", "system_prompt"}
    return {k: None if f.is_required() else f.default
            for k, f in taskset_config_type(name).model_fields.items() if k not in skip}


def load_vf_env(target: str, options: dict):
    """The verifiers Env the spec names, built with `options`, its unpinned seats played locally."""
    import verifiers.v1 as vf

    spec = f"verifiers:{target}"
    name, fn = _loader(target)
    options = {k: v for k, v in options.items() if v is not None}
    try:
        if fn is None:
            env = vf.load_environment(vf.resolve_env_config({"taskset": {"id": name, **options}}))
        else:
            env = fn(**options)
    except (Exception, SystemExit) as e:  # a loader that exits is refused like one that raises
        raise EnvSpecError(f"{spec!r}: the loader raised {type(e).__name__}: {_first_line(e)}") from e
    if not isinstance(env, vf.Env):
        raise EnvSpecError(f"{spec!r}: the loader returned {type(env).__name__}, not a verifiers Env "
                           "(verifiers.v1.Env, e.g. vf.SingleAgentEnv)")
    try:
        return localized(env)
    except Exception as e:
        raise EnvSpecError(f"{spec!r}: cannot run its seats locally: {type(e).__name__}: {_first_line(e)}") from e


def _first_line(e: Exception) -> str:
    return next((line.strip() for line in str(e).splitlines() if line.strip()), "")


def localized(env):
    """`env` rebuilt with each seat that pins no harness played by the in-process chat harness, and each seat
    that names no runtime on the local subprocess runtime."""
    import verifiers.v1 as vf
    from verifiers.v1.configs.agent import agent_config_fields

    from nanorllm.envs.verifiers_harness import ChatHarnessConfig

    seats = {}
    for name, seat in agent_config_fields(env.config).items():
        update = {}
        if seat.harness is None:
            update["harness"] = ChatHarnessConfig()
        if "runtime" not in seat.model_fields_set:
            update["runtime"] = vf.SubprocessConfig()
        seats[name] = seat.model_copy(update=update)
    return type(env)(env.config.model_copy(update=seats))


class Verifiers(AgentBundle):
    """A verifiers environment (subclassed per spec by `bundle_class`)."""

    name: ClassVar[str] = "verifiers"
    target: ClassVar[str] = ""
    cut_ends_truncated: ClassVar[bool] = True  # an env: the env rule of truncation (AgentBundle)
    default_tasks: ClassVar[str] = f"{PREFIX}train"
    default_eval_tasks: ClassVar[str] = f"{PREFIX}eval"

    def __init__(self, settings=None, **options):
        super().__init__(self.episode, settings, **options)
        for var, value in OFFLINE.items():  # before the env loads: its loader may install too
            os.environ.setdefault(var, value)
        self.vf_env = load_vf_env(self.target, self.options)
        self.task_cls = type(self.vf_env.taskset).task_type()

    def load_tasks(self, spec: str, *, limit: int | None = None) -> list[dict]:
        split, size = parse_split(spec)
        taskset = self.vf_env.taskset
        if size is None and not taskset.bounded:
            raise ValueError(f"{spec!r}: {type(taskset).__name__} is infinite: read a bounded part, {spec},size=N")
        rows = []
        for task in itertools.islice(taskset, size):
            if split != "all" and held_out(task.key) != (split == "eval"):
                continue
            rows.append({"task_id": f"vf-{task.key[:16]}", "question": task.data.prompt_text,
                         "answer": str(getattr(task.data, "answer", "")), "vf_data": task.data.model_dump(mode="json")})
            if limit is not None and len(rows) >= limit:
                break
        return rows

    async def episode(self, task: dict, client) -> dict:
        """One verifiers episode of `task` against `client`'s endpoint: its reward, its named rewards and metrics."""
        from verifiers.v1.clients import EvalClientConfig, ModelContext

        vf_task = self.task_cls(self.task_cls.data_type().model_validate(task["vf_data"]),
                                self.vf_env.taskset.config.task)
        os.environ[TOKEN_VAR] = client.api_key  # the same endpoint token for every episode of this process
        ctx = ModelContext(model=MODEL_NAME, client=EvalClientConfig(base_url=str(client.base_url),
                                                                     api_key_var=TOKEN_VAR))
        async with self.vf_env.serving():
            episode = await self.vf_env.run_episode(vf_task, ctx)
        errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
        if not episode.ok or errors:
            why = "; ".join(f"{e.type}: {e.message}" for e in errors) or "verifiers marked the episode failed"
            raise RuntimeError(f"the verifiers episode failed: {why}")
        rewards = {f"reward/{k}": r.score for t in episode.traces for k, r in t.rewards.items() if r is not None}
        metrics = {f"metric/{k}": v for t in episode.traces for k, v in t.metrics.items() if v is not None}
        return {"reward": sum(t.reward for t in episode.traces), **rewards, **metrics, "turns": episode.num_turns}

    def metrics(self, results: list[RolloutResult]) -> dict:
        """The mean of each named reward and metric over the episodes that have it, beside the endpoint's counts."""
        out = super().metrics(results)
        values: dict[str, list[float]] = {}
        for r in results:
            returned = r.trajectory.steps[-1].info.get("returned", {}) if r.trajectory.steps else {}
            for k, v in returned.items():
                if k.startswith(("reward/", "metric/")) and isinstance(v, (int, float)) and math.isfinite(v):
                    values.setdefault(f"verifiers/{k}", []).append(float(v))
        return {**out, **{k: sum(v) / len(v) for k, v in values.items()}}


def bundle_class(target: str) -> type[Verifiers]:
    """The bundle of `--env verifiers:MODULE[:LOADER]`, its module and loader checked at start."""
    args = loader_args(target)
    return type(f"Verifiers[{target}]", (Verifiers,), {"name": f"verifiers:{target}", "target": target,
                                                      "args": args, "__module__": __name__})
