"""The reward sources a run can name, one registry: each source is one module in rewards/ that holds its flags (a
config group, a dataclass of fields: config/fields.py composes it into every program that scores), its spec (a
frozen dataclass: data, so it travels to a spawned worker, which builds the same source from it) and registers it
once, `register_reward_source(name, SpecType, build, problems, names=, held=, settings=, from_settings=)`:
build(spec) -> the source objects RewardSources scores with (rewards/functions.py: a name, a spec, a weight, a call),
problems(spec) -> what stops it on this machine, one line each naming the field (its file does not import, its
folder is no reward model, its key is not set), checked before a run starts; names(spec) -> what a hang report calls
each source it builds (their `spec`); held(spec) -> the models it holds in every process that scores (`HeldModel`),
which the memory plan counts; settings, its config group, and from_settings(group) -> the spec its flags name, or
None when they name none. The config reads every registered source's spec off itself in one place
(`reward_source_specs` below, in the order the config declares their groups); the env assembly
(envs/registry.py `load_bundle`) builds whichever specs a run's `EnvSpec.reward_sources` holds, in that order; the
run's start-up checks (run/world.py), the memory plan (memory/plan.py) and the workers' heartbeat (pipeline/pool.py)
ask each for the rest: none of them names a source. A source registered from user code without `settings` has no
flags; its spec goes into an `EnvSpec` by hand.

Registered here: "functions" (--reward, functions.py), "reward_model" (--reward-model, model.py) and "judge"
(--judge, judge.py); the config imports each for its group.
"""

from dataclasses import dataclass, fields
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
    what its sources are called, which models they hold, and its config group with the spec that group names."""

    name: str
    spec_type: type
    build: Callable[[Any], list]
    problems: Callable[[Any], list[str]]
    names: Callable[[Any], list[str]]
    held: Callable[[Any], list[HeldModel]]
    settings: type | None
    from_settings: Callable[[Any], Any]


REWARD_SOURCES: dict[str, RewardSourceKind] = {}


def register_reward_source(name: str, spec_type: type, build: Callable[[Any], list],
                           problems: Callable[[Any], list[str]] = lambda spec: [], *,
                           names: Callable[[Any], list[str]] = lambda spec: [],
                           held: Callable[[Any], list[HeldModel]] = lambda spec: [],
                           settings: type | None = None,
                           from_settings: Callable[[Any], Any] = lambda settings: None) -> None:
    """Register a reward source: specs of `spec_type` become `build(spec)`'s sources, `problems(spec)` says what
    stops one at start, `names(spec)` what its sources are called and `held(spec)` the models they hold;
    `from_settings(group)` is the spec its config group `settings` names (None: none). A name or spec type taken by
    another source is refused (registering the same pair again, as a module reloaded does, is not)."""
    for kind in REWARD_SOURCES.values():
        if (kind.name == name or kind.spec_type is spec_type) and (kind.name, kind.spec_type) != (name, spec_type):
            raise ValueError(f"reward source {name!r} ({spec_type.__name__}): {kind.name!r} "
                             f"({kind.spec_type.__name__}) is registered already")
    REWARD_SOURCES[name] = RewardSourceKind(name, spec_type, build, problems, names, held, settings, from_settings)


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


def reward_source_specs(cfg) -> tuple:
    """A config's reward sources as specs, in the order they score: the spec each registered source's group names
    in `cfg` (its module's `from_settings`), for every group `cfg` composes, in the order `cfg` declares the groups'
    fields (--reward, --reward-model, --judge); a program without a source's group names none of it."""
    position = {f.name: i for i, f in enumerate(fields(cfg))}
    kinds = [k for k in REWARD_SOURCES.values() if k.settings is not None and isinstance(cfg, k.settings)]
    kinds.sort(key=lambda k: position[fields(k.settings)[0].name])
    return tuple(spec for k in kinds if (spec := k.from_settings(cfg)) is not None)
