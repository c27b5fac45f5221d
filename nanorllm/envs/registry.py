"""Finding the bundle `--env` names: a built-in name, `module.path:Name`, `path/to/file.py:Name`, or
`ECOSYSTEM:TARGET` for an environment of a library users already have (`ADAPTERS`).

The spec string, never the class, is what travels: a spawned worker imports the same module again
from it. `--env-arg key=value` values are typed by the bundle's defaults (int, finite float, bool, str; JSON or
a comma list for a list or tuple, JSON for a dict, or one entry of a dict as `key.entry=value`).
Everything wrong with a spec is an `EnvSpecError` naming the spec, the reason and the valid options,
raised at start before any model loads.
"""

import importlib
import importlib.util
import json
import math
from dataclasses import dataclass, field

from nanorllm.core.limits import AGENT_TIMEOUT_S, MAX_TOOL_CALLS, TOOL_TIMEOUT_S
from nanorllm.datasets.holdout import default_holdout, held_out, is_holdout, parse_holdout
from nanorllm.datasets.tasks import remove_overlap
from nanorllm.envs.agent_fn import AgentBundle, check_agent_function
from nanorllm.envs.base import AGENT_METHODS, ENV_METHODS, EnvBundle, EpisodeSettings
from nanorllm.utils.modules import EnvSpecError, _import_module, import_spec  # noqa: F401  (EnvSpecError is imported from here)

BUILTIN_ENVS = {"math": "nanorllm.envs.math_env:MathSelfRefine",
                "calc": "nanorllm.envs.calc_env:CalculatorTool",
                "single": "nanorllm.envs.single:SingleTurn"}  # one turn, scored by --reward functions
DEFAULT_ENV = "math"


@dataclass(frozen=True)
class Adapter:
    """An ecosystem's environments as bundles: `module` (a file under nanorllm/envs/) has
    `bundle_class(target: str) -> type[EnvBundle]` for the TARGET of `--env PREFIX:TARGET`; `package` is the
    ecosystem's import name, installed by the optional extra `extra`. Only a named adapter is imported."""

    module: str
    package: str
    extra: str


ADAPTERS: dict[str, Adapter] = {
    "reasoning-gym": Adapter("nanorllm.envs.reasoning_gym", "reasoning_gym", "reasoning-gym"),
    "textarena": Adapter("nanorllm.envs.textarena", "textarena", "textarena"),
    "openenv": Adapter("nanorllm.envs.openenv", "openenv", "openenv"),
    "verifiers": Adapter("nanorllm.envs.verifiers_env", "verifiers", "verifiers"),
}


def adapter_class(spec: str) -> type[EnvBundle] | None:
    """The bundle class of an `ECOSYSTEM:TARGET` spec (None: the spec names no adapter)."""
    prefix, sep, target = spec.partition(":")
    adapter = ADAPTERS.get(prefix)
    if adapter is None or not sep:
        return None
    if not target:
        raise EnvSpecError(f"{spec!r}: expected {prefix}:TARGET")
    if importlib.util.find_spec(adapter.package) is None:
        raise EnvSpecError(f"{spec!r}: {adapter.package} is not installed "
                           f"(pip install -e '.[{adapter.extra}]', or '.[envs]' for every ecosystem)")
    try:
        return importlib.import_module(adapter.module).bundle_class(target)
    except EnvSpecError:
        raise
    except Exception as e:  # the ecosystem raised while it looked the target up
        raise EnvSpecError(f"{spec!r}: {type(e).__name__}: {e}") from e


def bundle_class(spec: str) -> type[EnvBundle]:
    """The bundle class a spec names, checked for the methods the engine calls."""
    cls = adapter_class(spec)
    if cls is not None:
        return _checked(spec, cls, cls.__name__)
    target = BUILTIN_ENVS.get(spec, spec)
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise EnvSpecError(f"{spec!r}: expected module.path:Name or path/to/file.py:Name "
                           f"(or one of {', '.join(BUILTIN_ENVS)})")
    try:
        module = _import_module(where, spec)
    except EnvSpecError:
        raise
    except Exception as e:  # a module that does not import, or raises while importing
        raise EnvSpecError(f"{spec!r}: cannot import {where!r}: {type(e).__name__}: {e}") from e
    cls = getattr(module, name, None)
    if cls is None:
        raise EnvSpecError(f"{spec!r}: {where!r} has no {name!r}")
    return _checked(spec, cls, name)


def _checked(spec: str, cls, name: str) -> type[EnvBundle]:
    if not (isinstance(cls, type) and issubclass(cls, EnvBundle)):
        raise EnvSpecError(f"{spec!r}: {name} is not an EnvBundle subclass (nanorllm.envs.base.EnvBundle)")
    missing = []
    if cls.make_env is EnvBundle.make_env:  # the default builds env_class: it must be a whole Env
        env_class = getattr(cls, "env_class", None)
        if env_class is None:
            missing.append("env_class (or a make_env method)")
        else:
            missing += [f"{env_class.__name__}.{m}" for m in ENV_METHODS if not callable(getattr(env_class, m, None))]
    if cls.make_agent is EnvBundle.make_agent:
        missing += [f"{cls.agent_class.__name__}.{m}" for m in AGENT_METHODS
                    if not callable(getattr(cls.agent_class, m, None))]
    if missing:
        raise EnvSpecError(f"{spec!r}: {name} is missing {', '.join(missing)}")
    return cls


def _typed(value: str, default, key: str, spec: str):
    """`value` as the type of the option's default: bool (true/false/1/0), int, a finite float, text; a list,
    tuple or dict default takes JSON (`[1, 2]`, `{"a": 1}`) and a list or tuple also a comma list (`a,b`),
    each item typed like the default's first one. Any other default type cannot be set from the command line."""
    def refuse(expected: str):
        return EnvSpecError(f"{spec!r}: --env-arg {key}={value}: expected {expected}")

    if default is None or isinstance(default, str):
        return value
    if isinstance(default, bool):
        if value.lower() not in ("true", "false", "1", "0"):
            raise refuse("true or false")
        return value.lower() in ("true", "1")
    if isinstance(default, (int, float)):
        try:
            out = type(default)(value)
        except ValueError:
            raise refuse(f"a{'n' if isinstance(default, int) else ''} {type(default).__name__}") from None
        if not math.isfinite(out):
            raise refuse("a finite number")
        return out
    if isinstance(default, (list, tuple, dict)):
        kind = type(default).__name__
        if value.startswith(("[", "{")):
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError as e:
                raise refuse(f"a {kind} as JSON ({e.msg})") from None
            if not isinstance(parsed, dict if isinstance(default, dict) else list):
                raise refuse(f"a {kind}, got JSON {type(parsed).__name__}")
            return type(default)(parsed)
        if isinstance(default, dict):
            raise refuse('a dict as JSON, e.g. {"a": 1}')
        items = [v.strip() for v in value.split(",")] if value else []
        if default:
            items = [_typed(v, default[0], key, spec) for v in items]
        return type(default)(items)
    raise EnvSpecError(f"{spec!r}: --env-arg {key}: its default {default!r} ({type(default).__name__}) cannot be set "
                       "from the command line")


def _json_or_text(value: str):
    """A dict option's entry: its JSON value (100, true, [1, 2]), else the text itself."""
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def parse_env_args(spec: str, cls: type[EnvBundle], pairs: tuple[str, ...] | list[str]) -> dict:
    """{"key": typed value} from "key=value" strings, each key one the bundle declares; `key.entry=value` sets one
    entry of a dict option (JSON, else text)."""
    valid = ", ".join(f"{k}={v!r}" for k, v in cls.args.items()) or "none"
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise EnvSpecError(f"{spec!r}: --env-arg {pair!r} is not key=value (valid: {valid})")
        head, dot, sub = key.partition(".")
        if dot and sub and isinstance(cls.args.get(head), dict):  # one entry of a dict option: reset.size=100
            out.setdefault(head, dict(cls.args[head]))[sub] = _json_or_text(value.strip())
            continue
        if key not in cls.args:
            raise EnvSpecError(f"{spec!r}: unknown --env-arg {key!r} (valid: {valid})")
        if key in out:
            raise EnvSpecError(f"{spec!r}: --env-arg {key!r} is given twice")
        out[key] = _typed(value.strip(), cls.args[key], key, spec)
    return out


def load_env(spec: str = DEFAULT_ENV, settings: EpisodeSettings | None = None,
             env_args: tuple[str, ...] | list[str] = ()) -> EnvBundle:
    """The configured bundle; a bundle's own refusal of its options is an EnvSpecError too."""
    cls = bundle_class(spec)
    options = parse_env_args(spec, cls, env_args)
    try:
        bundle = cls(settings, **options)
    except EnvSpecError:  # the bundle's own check of the world (a server that does not answer): already one line
        raise
    except (TypeError, ValueError) as e:
        valid = ", ".join(f"{k}={v!r}" for k, v in cls.args.items()) or "none"
        raise EnvSpecError(f"{spec!r}: {e} (valid --env-arg: {valid})") from e
    bundle.spec = spec
    return bundle


def load_agent(spec: str, settings: EpisodeSettings | None = None, *, timeout_s: float = AGENT_TIMEOUT_S,
               tool_parser: str = "auto") -> AgentBundle:
    """The AgentBundle of an --agent spec (module.path:fn or path/to/file.py:fn), refused like an --env
    spec when it does not import, names nothing or names a function of the wrong signature."""
    module, where, name = import_spec(spec, "module.path:function or path/to/file.py:function")
    fn = getattr(module, name, None)
    if fn is None:
        raise EnvSpecError(f"{spec!r}: {where!r} has no {name!r}")
    why = check_agent_function(fn)
    if why:
        raise EnvSpecError(f"{spec!r}: {name} cannot be an agent: {why}")
    bundle = AgentBundle(fn, settings, timeout_s=timeout_s, tool_parser=tool_parser)
    bundle.spec = spec
    return bundle


@dataclass(frozen=True)
class EnvSpec:
    """What names a run's episodes, as data: it travels to a spawned worker, which builds the same bundle
    from it (the spec strings are imported again there)."""

    env: str = DEFAULT_ENV  # a built-in name, module.path:Name or path/to/file.py:Name
    env_args: tuple[str, ...] = ()  # the bundle's own options, key=value
    agent: str | None = None  # an --agent function instead of an env
    agent_timeout_s: float = AGENT_TIMEOUT_S
    tool_parser: str = "auto"  # policy/tool_calls.py: a parser's name, or auto (the chat template's)
    reward_sources: tuple = ()  # the specs of the reward sources that score the env's episodes (rewards/sources.py)
    reward_mode: str = "add"  # their weighted sum added to the env's reward, or replacing it
    tools: str | None = None  # --tools functions the env's episodes may call (envs/tools.py)
    max_tool_calls: int = MAX_TOOL_CALLS
    tool_timeout_s: float = TOOL_TIMEOUT_S
    settings: EpisodeSettings = field(default_factory=EpisodeSettings)


def load_bundle(spec: EnvSpec, *, rewards: bool = True) -> EnvBundle:
    """The run's episodes: its agent when the spec names one, else its env; with tools, wrapped so that its
    episodes may call them (envs/tools.py); with reward sources (rewards/sources.py: the --reward functions, a reward
    model, a judge, each built from its spec), wrapped so that they score its episodes (envs/scored.py)."""
    if spec.agent:
        return load_agent(spec.agent, spec.settings, timeout_s=spec.agent_timeout_s,
                          tool_parser=spec.tool_parser)
    bundle = load_env(spec.env, spec.settings, spec.env_args)
    if isinstance(bundle, AgentBundle):  # an env whose episodes run on the agent endpoint (verifiers): its limits
        bundle.timeout_s, bundle.tool_parser = spec.agent_timeout_s, spec.tool_parser
    if spec.tools:
        from nanorllm.envs.tools import ToolBundle, load_tools

        bundle = ToolBundle(bundle, load_tools(spec.tools), max_calls=spec.max_tool_calls,
                            timeout_s=spec.tool_timeout_s, parser=spec.tool_parser)
    if not rewards or not spec.reward_sources:
        return bundle
    from nanorllm.envs.scored import RewardBundle
    from nanorllm.rewards.sources import build_reward_sources

    return RewardBundle(bundle, build_reward_sources(spec.reward_sources), spec.reward_mode)


def resolve_task_specs(tasks: str | None, eval_tasks: str | None, env: EnvBundle) -> tuple[str | None, str]:
    """(training, held-out) task specs: the ones given, else the env's own defaults (held-out '' when the env
    has none). Given tasks and no held-out ones, the held-out set is a seeded share of those tasks
    (datasets/holdout.py), never the env's own set, which may have nothing to do with them."""
    if eval_tasks is None:
        eval_tasks = (env.default_eval_tasks or "") if tasks is None else default_holdout(tasks)
    return env.default_tasks if tasks is None else tasks, eval_tasks


def training_tasks(env: EnvBundle, tasks: str | None, eval_tasks: str | None = None,
                   limit: int | None = None) -> list[dict]:
    """The first `limit` of the tasks a training run with these specs trains on: `tasks` (None: the env's default)
    less those its held-out set holds (`eval_tasks`; None: the one launch/train.py holds out by default), by
    datasets/tasks.py's OVERLAP_RULE. What demonstrations and rejection sampling draw from, so that nothing they
    write for SFT is a task the RL run evaluates."""
    train, heldout = resolve_task_specs(tasks, eval_tasks, env)
    return remove_overlap(load_env_tasks(env, train), load_env_tasks(env, heldout) if heldout else [])[0][:limit]


def load_env_tasks(env: EnvBundle, spec: str, limit: int | None = None) -> list[dict]:
    """`env.load_tasks(spec)`, and for `holdout:...:SPEC` the held-out share of the env's SPEC (at most `limit`)."""
    if not is_holdout(spec):
        return env.load_tasks(spec, limit=limit)
    fraction, seed, inner = parse_holdout(spec)
    return held_out(env.load_tasks(inner), fraction, seed)[:limit]


def describe(bundle: EnvBundle) -> str:
    """One line for the start of a run: the env and every option with its value."""
    opts = ", ".join(f"{k}={v!r}" for k, v in bundle.options.items()) or "no options"
    return f"[env] {bundle.name} ({bundle.spec}) | {opts}"
