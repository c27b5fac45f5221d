"""The reward sources a run can name, one registry: each source is one module in rewards/ that holds its spec (a
frozen dataclass: data, so it travels to a spawned worker, which builds the same source from it) and registers it
once, `register_reward_source(name, SpecType, build, problems, names=, held=)`: build(spec) -> the source objects
RewardSources scores with (rewards/functions.py: a name, a spec, a weight, a call), problems(spec) -> what stops it
on this machine, one line each naming the field (its file does not import, its folder is no reward model, its key is
not set), checked before a run starts; names(spec) -> what a hang report calls each source it builds (their `spec`);
held(spec) -> the models it holds in every process that scores (`HeldModel`), which the memory plan counts. The env
assembly (envs/registry.py `load_bundle`) builds whichever specs a run's `EnvSpec.reward_sources` holds, in their
order; the run's start-up checks (run/world.py), the memory plan (memory/plan.py) and the workers' heartbeat
(pipeline/pool.py) ask each for the rest: none of them names a source. The config's groups become those specs in one
place (config/specs.py `reward_source_specs`).

A spec's class is its module's, so a spec that exists has had its module imported and its source registered
(unpickling one in a worker imports the module too): each source's file is still imported only when a run names
it. Registered here: "functions" (--reward, functions.py), "reward_model" (--reward-model, model.py) and "judge"
(--judge, judge.py).
"""

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class HeldModel:
    """A model a reward source holds, frozen, in each process that scores: a sequence-classification model read from
    `path`'s config, in `dtype_bytes` per parameter, scoring `batch_tokens` tokens a forward, on `device` (None: the
    process's own). What the memory plan needs to count it before any weights load."""

    label: str  # the plan's part name
    path: str
    batch_tokens: int
    dtype_bytes: int
    device: str | None
    note: str = ""


@dataclass(frozen=True)
class RewardSourceKind:
    """One registered reward source: its name, the type of its spec, how a spec becomes its sources, what stops one,
    what its sources are called and which models they hold."""

    name: str
    spec_type: type
    build: Callable[[Any], list]
    problems: Callable[[Any], list[str]]
    names: Callable[[Any], list[str]]
    held: Callable[[Any], list[HeldModel]]


REWARD_SOURCES: dict[str, RewardSourceKind] = {}


def register_reward_source(name: str, spec_type: type, build: Callable[[Any], list],
                           problems: Callable[[Any], list[str]] = lambda spec: [], *,
                           names: Callable[[Any], list[str]] = lambda spec: [],
                           held: Callable[[Any], list[HeldModel]] = lambda spec: []) -> None:
    """Register a reward source: specs of `spec_type` become `build(spec)`'s sources, `problems(spec)` says what
    stops one at start, `names(spec)` what its sources are called and `held(spec)` the models they hold. A name or
    spec type taken by another source is refused (registering the same pair again, as a module reloaded does, is
    not)."""
    for kind in REWARD_SOURCES.values():
        if (kind.name == name or kind.spec_type is spec_type) and (kind.name, kind.spec_type) != (name, spec_type):
            raise ValueError(f"reward source {name!r} ({spec_type.__name__}): {kind.name!r} "
                             f"({kind.spec_type.__name__}) is registered already")
    REWARD_SOURCES[name] = RewardSourceKind(name, spec_type, build, problems, names, held)


def kind_of(spec) -> RewardSourceKind:
    """The registered source a spec is of; TypeError for a spec no source registered."""
    kind = next((k for k in REWARD_SOURCES.values() if isinstance(spec, k.spec_type)), None)
    if kind is None:
        raise TypeError(f"no reward source is registered for a {type(spec).__name__} "
                        f"(registered: {', '.join(REWARD_SOURCES) or 'none'})")
    return kind


def build_reward_sources(specs: tuple | list) -> list:
    """Every source the specs name, in their order."""
    return [source for spec in specs for source in kind_of(spec).build(spec)]


def reward_source_problems(specs: tuple | list) -> list[str]:
    """What stops each source the specs name on this machine, one line each, in their order."""
    return [line for spec in specs for line in kind_of(spec).problems(spec)]


def reward_source_names(specs: tuple | list) -> list[str]:
    """What each source the specs name is called (the `spec` a hang report gives), in their order."""
    return [n for spec in specs for n in kind_of(spec).names(spec)]


def reward_source_models(specs: tuple | list) -> list[HeldModel]:
    """The models the sources the specs name hold in each process that scores, in their order."""
    return [m for spec in specs for m in kind_of(spec).held(spec)]
