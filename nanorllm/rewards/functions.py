"""Reward functions as users already write them, scoring a batch of episodes at once.

    --reward path/to/rewards.py:fn --reward module.path:fn2 --reward-weights 1.0 0.5 --reward-mode add

Two signatures are recognised, by their parameter names:

- TRL: `fn(completions, **columns) -> list[float | None]`, one call per batch. `completions` are the episodes'
  last responses: text, or for a conversational task (its question a list of chat messages) a list of one
  assistant message, as TRL passes them; every task column (question, answer, task_id and a dataset's own
  columns) comes as a list beside them, each one the function names (all of them to a `**kwargs`); `prompts`
  (the questions) and `completion_ids` (the last responses' token ids) only when it asks for them. A name it
  takes without a default that no task column fills is refused when the tasks load (RewardSources.check_tasks).
  None for a completion means the function does not apply to it (TRL's NaN, summed with nansum): the other
  functions' values and the env's reward stand; where none is left (every function None, and `replace` or
  `single`), the episode is an env error, counted in rollout/env_errors and left out of its group.
- verl: `compute_score(data_source, solution_str, ground_truth, extra_info) -> float` (or a dict with a
  "score"), one call per episode: data_source is the task's "data_source" column or the env's name,
  ground_truth its answer, extra_info the whole task.

`RewardSources` holds a run's reward *sources* (`functions`): these functions, a --reward-model
(rewards/model.py) and a --judge (rewards/judge.py), anything with a `name`, a `spec`, a `weight` and
`__call__(results, env_name) -> list[float | None]`. With an env the sources' weighted sum is added to the env's
reward (`add`) or takes its place (`replace`); with no `--env` the run uses `single` (envs/single.py), one turn
whose only reward is the sources'. envs/scored.py's RewardBundle wraps the run's env bundle with them; the engine
calls its `score_batch` once per rollout call, in a worker or in the trainer alike (the spec strings travel; each
process imports the files again, as it does `--env` files).

A failed score is not a zero (docs/rewards.md): a source that raises, or a function that does not return within
`--reward-timeout-s` (one line names it and the limit; the call is left running in a daemon thread, which cannot
hold up the process's exit), fails the score of every episode it was given; a value of nan or inf fails that
episode's. A failed episode ends "reward_failed", the sources that failed it named in its last step's
info["reward_failed"]; it leaves its group (algos/groups.py drop_failed) and is counted in
reward/failed/<name>. A source that returns the wrong number of values, or a value that is no number at all, is
a `RewardFunctionError` naming it, which stops the run (a programming error, not a score). While a source runs,
the engine's `watch` hears "reward function <spec>", so a hang report names it.
"""

import inspect
import math
import numbers
import sys
import traceback
from dataclasses import dataclass
from typing import Annotated, Callable, Literal

import tyro

from nanorllm.core.limits import REWARD_TIMEOUT_S
from nanorllm.core.types import RolloutResult, ending
from nanorllm.datasets.errors import TaskFileError
from nanorllm.rewards.sources import register_reward_source
from nanorllm.utils.modules import EnvSpecError, import_spec
from nanorllm.utils.timed import CallTimeout, call_with_limit

VERL_PARAMS = ("data_source", "solution_str", "ground_truth")
_reported: set[tuple] = set()


class RewardFunctionError(ValueError):
    """A reward function returned something that cannot be a batch of rewards."""


class RewardTimeout(Exception):
    """A reward function did not return within its time limit: the scores of the batch it was given failed."""


@dataclass
class RewardFunction:
    spec: str
    name: str
    fn: Callable
    kind: str  # "trl" or "verl"
    params: tuple[str, ...]  # the names a TRL function takes (all columns when it has **kwargs)
    var_kw: bool
    weight: float = 1.0
    required: tuple[str, ...] = ()  # the names it takes without a default
    timeout_s: float = REWARD_TIMEOUT_S  # wall-clock limit of one call (--reward-timeout-s)

    def __call__(self, results: list[RolloutResult], env_name: str) -> list[float | None]:
        tasks = [r.trajectory.task for r in results]
        completions = [r.trajectory.steps[-1].model_response if r.trajectory.steps else "" for r in results]
        if self.kind == "trl":  # TRL's shape: a conversational prompt's completion is a list of messages too
            completions = [[{"role": "assistant", "content": c}] if isinstance(t.get("question"), list) else c
                           for t, c in zip(tasks, completions)]
        if self.kind == "verl":
            out = [self.call(data_source=t.get("data_source", env_name), solution_str=c, ground_truth=t.get("answer"),
                             extra_info=t) for t, c in zip(tasks, completions)]
            out = [v.get("score") if isinstance(v, dict) else v for v in out]
        else:
            kwargs = {}
            if self.var_kw or "prompts" in self.params:
                kwargs["prompts"] = [t.get("question") for t in tasks]
            if self.var_kw or "completion_ids" in self.params:
                kwargs["completion_ids"] = [r.step_samples[-1].response_ids if r.step_samples else [] for r in results]
            for column in dict.fromkeys(k for t in tasks for k in t):
                if (self.var_kw or column in self.params) and column not in ("completions", *kwargs):
                    kwargs[column] = [t.get(column) for t in tasks]
            out = self.call(completions, **kwargs)
        return out

    def call(self, *args, **kwargs):
        """self.fn(*args, **kwargs) under its time limit (utils/timed.py): its value, or what it raised;
        RewardTimeout past the limit (the call is abandoned: a daemon thread does not hold up the exit)."""
        try:
            return call_with_limit(self.fn, self.timeout_s, f"reward:{self.name}", *args, **kwargs)
        except CallTimeout:
            raise RewardTimeout(f"reward function {self.spec} did not return within --reward-timeout-s "
                                f"{self.timeout_s:g} s") from None

    def missing_columns(self, columns: set[str]) -> list[str]:
        """The names this function takes without a default that no task column, and nothing we pass, fills."""
        if self.kind != "trl":
            return []
        return [p for p in self.required if p not in ("completions", "prompts", "completion_ids") and p not in columns]


def load_reward_function(spec: str, weight: float = 1.0) -> RewardFunction:
    """The function a spec names (path/to/file.py:fn or module.path:fn), its signature recognised."""
    module, where, name = import_spec(spec, "path/to/file.py:function or module.path:function")
    fn = getattr(module, name, None)
    if not callable(fn):
        raise EnvSpecError(f"{spec!r}: {where!r} has no function {name!r}")
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError) as e:
        raise EnvSpecError(f"{spec!r}: cannot read the signature of {name}: {e}") from e
    names = tuple(p for p, v in params.items() if v.kind not in (v.VAR_POSITIONAL, v.VAR_KEYWORD))
    required = tuple(p for p in names if params[p].default is inspect.Parameter.empty)
    var_kw = any(v.kind == v.VAR_KEYWORD for v in params.values())
    if all(p in names for p in VERL_PARAMS):
        kind = "verl"
    elif names[:1] == ("completions",) or (names and "completions" in names):
        kind = "trl"
    else:
        raise EnvSpecError(f"{spec!r}: {name}{inspect.signature(fn)} has neither TRL's signature "
                           "fn(completions, **columns) -> list[float] nor verl's compute_score(data_source, "
                           "solution_str, ground_truth, extra_info) -> float")
    return RewardFunction(spec=spec, name=name, fn=fn, kind=kind, params=names, var_kw=var_kw, weight=weight,
                          required=required)


def load_reward_functions(specs: tuple[str, ...], weights: tuple[float, ...] = (),
                          timeout_s: float = REWARD_TIMEOUT_S) -> list[RewardFunction]:
    weights = weights or (1.0,) * len(specs)
    fns = [load_reward_function(s, w) for s, w in zip(specs, weights)]
    for f in fns:
        f.timeout_s = timeout_s
    names = [f.name for f in fns]
    for f in fns:  # two functions of one name log apart: reward/<name>, reward/<name>_2 ...
        if names.count(f.name) > 1:
            f.name = f"{f.name}_{[g for g in fns if g.name == f.name].index(f) + 1}"
    return fns


@dataclass
class RewardFunctions:
    """Reward functions as reward sources (docs/rewards.md)."""

    reward: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """Reward functions, path/to/file.py:fn or module.path:fn, one flag each: TRL's fn(completions, **columns) ->
    list[float] or verl's compute_score(data_source, solution_str, ground_truth, extra_info). Without --env the run is
    single-turn (--env single) and they give the only reward; with one, see --reward-mode."""
    reward_weights: tuple[float, ...] = ()
    """One weight per --reward (empty: 1 each); an episode's reward from them is the weighted sum."""
    reward_mode: Literal["add", "replace"] = "add"
    """With an env: 'add' the functions' weighted sum to the env's reward, or 'replace' it."""
    reward_timeout_s: float = REWARD_TIMEOUT_S
    """Wall-clock limit (seconds, at most a day) of one call of a --reward function; past it the scores of the batch it was given
    failed (left out of their groups, reward/failed/<name>), one line names the function, and the call is abandoned."""


@dataclass(frozen=True)
class RewardFunctionsSpec:
    """The --reward functions as data (a reward source's spec, rewards/sources.py): their specs, one weight each
    (empty: 1 each) and one call's wall-clock limit."""

    specs: tuple[str, ...] = ()
    weights: tuple[float, ...] = ()
    timeout_s: float = REWARD_TIMEOUT_S


def reward_functions_spec(settings: RewardFunctions) -> RewardFunctionsSpec | None:
    """The --reward functions, their weights and one call's limit; None without any."""
    if not settings.reward:
        return None
    return RewardFunctionsSpec(specs=settings.reward, weights=settings.reward_weights,
                               timeout_s=settings.reward_timeout_s)


def functions_problems(spec: RewardFunctionsSpec) -> list[str]:
    """Each --reward file imports and its function has TRL's or verl's signature."""
    p = []
    for one in spec.specs:
        try:
            load_reward_function(one)  # imports the file: a bad spec or signature stops here
        except EnvSpecError as e:
            p.append(f"reward: {e}")
    return p


register_reward_source("functions", RewardFunctionsSpec,
                       lambda spec: load_reward_functions(spec.specs, spec.weights, spec.timeout_s),
                       functions_problems, names=lambda spec: list(spec.specs), settings=RewardFunctions,
                       from_settings=reward_functions_spec)


def checked_values(source, out: object, n: int) -> list[float | None]:
    """A source's values for a batch of `n` episodes: one number each, None where it does not apply (TRL's
    convention), nan where the score failed (a non-finite value is one). The wrong number of values, or a value
    that is no number at all, is a programming error: RewardFunctionError naming the source."""
    if not isinstance(out, (list, tuple)) or len(out) != n:
        got = f"{len(out)} values" if isinstance(out, (list, tuple)) else type(out).__name__
        raise RewardFunctionError(f"reward {source.spec}: returned {got} for a batch of {n} completions "
                                  "(expected one number each, or None where it does not apply)")
    bad = [(i, v) for i, v in enumerate(out)
           if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real))]
    if bad:
        i, v = bad[0]
        raise RewardFunctionError(f"reward {source.spec}: value {i} is {v!r}, not a number or None "
                                  f"({len(bad)} such of {n})")
    return [None if v is None else float(v) if math.isfinite(v) else math.nan for v in out]


class RewardSources:
    """A run's reward sources (`functions`: RewardFunction objects, a reward model, a judge) and how their values
    meet an env's reward (`mode`: add or replace): the scoring of a batch, the failed-score rule, their metrics."""

    def __init__(self, functions: list, mode: str = "add"):
        self.functions, self.mode = functions, mode

    def check_tasks(self, spec: str, tasks: list) -> None:
        """TaskFileError when a function takes a column the tasks lack: it would fail every batch, each one an env
        error."""
        if not (isinstance(tasks, list) and all(isinstance(t, dict) for t in tasks)):
            return
        columns = {k for t in tasks for k in t}
        problems = [f"{spec}: reward function {f.spec} takes {p!r}, which is no column of these tasks (columns: "
                    f"{', '.join(sorted(columns)) or 'none'}); give it a default, or name a column the source has"
                    for f in self.functions if hasattr(f, "missing_columns") for p in f.missing_columns(columns)]
        if problems:
            raise TaskFileError(spec, problems)

    def metrics(self, results: list[RolloutResult]) -> dict:
        """Each source's mean over the episodes that trained (reward/<name>), the episodes whose score it failed
        (reward/failed/<name>, 0 too: curves without gaps) and a source's own (`metrics`, if it has it)."""
        scored = [r for r in results if not r.failed and r.trajectory.steps]
        out = {}
        for f in self.functions:
            values = [r.trajectory.steps[-1].info.get(f"reward/{f.name}") for r in scored]
            values = [v for v in values if v is not None and math.isfinite(v)]  # NaN: a failed score
            if values:
                out[f"reward/{f.name}"] = sum(values) / len(values)
            out[f"reward/failed/{f.name}"] = sum(f.name in r.trajectory.steps[-1].info.get("reward_failed", ())
                                                 for r in results if r.trajectory.steps)
            if hasattr(f, "metrics"):
                out.update(f.metrics(scored))
        return out

    def use_device(self, device) -> None:
        """The device of the process's policy: where a source that computes (a reward model) goes by default."""
        for f in self.functions:
            if hasattr(f, "use_device"):
                f.use_device(device)

    def score_batch(self, results: list[RolloutResult], env_name: str,
                    watch: Callable[[str], None] = lambda activity: None) -> None:
        """Each source once over the call's episodes (env errors, and those a source before it failed, left out);
        rewards set in place. An episode whose score a source failed (it raised, timed out, or gave nan or inf)
        ends "reward_failed", the sources' names in its last step's info["reward_failed"]: left out of its group,
        never trained as a 0. `watch` hears "reward function <spec>" before each source runs (the engine's hang
        detection)."""
        live = [r for r in results if r.trajectory.termination_reason != "error" and r.trajectory.steps]
        if not live:
            return
        scores: dict[int, dict[str, float]] = {id(r): {} for r in live}
        for f in self.functions:
            pending = [r for r in live if r.trajectory.termination_reason != "reward_failed"]
            if not pending:
                break
            watch(f"reward function {f.spec}")
            if hasattr(f, "progress"):  # a source bounded by its own timeouts (the judge) says it is alive
                f.progress = lambda spec=f.spec: watch(f"reward function {spec}")
            values, said = self.score(f, pending, env_name)
            for r, v in zip(pending, values):
                if v is None:
                    continue
                if math.isnan(v):
                    if not said:  # a source that raised is said already, with its error
                        _report_once(("nan", f.spec), f"[reward] {f.spec} gave no finite score for episode "
                                     f"{r.trajectory.task_id}: a failed score, left out of its group (counted in "
                                     f"reward/failed/{f.name}; printed once)")
                    last = r.trajectory.steps[-1]
                    last.info["reward_failed"] = [*last.info.get("reward_failed", ()), f.name]
                    r.trajectory.termination_reason = "reward_failed"
                else:
                    scores[id(r)][f.name] = v
        for r in live:
            got = scores[id(r)]
            last = r.trajectory.steps[-1]
            for name, value in got.items():
                last.info[f"reward/{name}"] = value
            if r.trajectory.termination_reason == "reward_failed":
                continue
            if not got and (self.mode == "replace" or env_name == "single"):
                _report_once(("none", *(f.spec for f in self.functions)),
                             f"[reward] no reward function scored episode {r.trajectory.task_id} (each returned None) "
                             "and no env reward stands in: such episodes are left out of training as env errors "
                             "(counted in rollout/env_errors; printed once)")
                r.trajectory.termination_reason = "error"
                continue
            extra = sum(f.weight * got[f.name] for f in self.functions if f.name in got)  # TRL's nansum
            if self.mode == "replace":
                for s in r.trajectory.steps:
                    s.reward = 0.0
            last.reward += extra
            total = sum(s.reward for s in r.trajectory.steps)
            r.trajectory.final_reward = total
            for s in r.step_samples:
                s.reward = total
            if env_name == "single":
                r.trajectory.termination_reason = ending(None, total, cut=r.cut)

    def score(self, source, results: list[RolloutResult], env_name: str) -> tuple[list[float | None], bool]:
        """(`source`'s checked values for `results`, whether its failure is said already): all nan (failed scores)
        when it raised or timed out."""
        try:
            return checked_values(source, source(results, env_name), len(results)), False
        except RewardFunctionError:
            raise
        except RewardTimeout as e:
            _report_once(("timeout", str(e)), f"[reward] {e}: failed scores for the {len(results)} episodes of this "
                         f"call (left out of their groups, counted in reward/failed/{source.name}; the call is left "
                         "running, abandoned; printed once)")
        except Exception as e:  # a score that could not be computed says nothing about the policy
            _report_once((type(e).__name__, str(e)[:80]),
                         f"[reward] {source.spec} raised: failed scores for the {len(results)} episodes of this call "
                         f"(left out of their groups, counted in reward/failed/{source.name}; printed once):\n"
                         f"{traceback.format_exc(limit=-8)}")
        return [math.nan] * len(results), True


def _report_once(key: tuple, line: str) -> None:
    if key not in _reported:
        _reported.add(key)
        print(line, file=sys.stderr, flush=True)
