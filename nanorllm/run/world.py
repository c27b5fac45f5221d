"""The config's checks that need the world: the env's or agent's module imports, each --reward file loads, the
--tools functions have schemas, a --reward-model folder is a sequence classifier, the --judge rubric reads and its
key is set, a user's --adv-estimator imports, the --teacher shares the student's tokenizer, the output folder can be made, wandb is installed. nanorllm/config checks a config on its own terms;
these run when a run's command line is parsed (run/args.py hands them to parse_config, so every problem of both is
reported at once, naming the field) and nothing is written before them."""

import importlib.util
import os
from dataclasses import replace
from pathlib import Path

from nanorllm.config import TrainConfig
from nanorllm.config.specs import env_spec
from nanorllm.envs.base import EnvBundle
from nanorllm.envs.registry import load_bundle
from nanorllm.run.assembly import run_devices
from nanorllm.utils.children import socket_folder_problem
from nanorllm.utils.devices import DeviceError
from nanorllm.utils.modules import EnvSpecError


def unwritable_dir(path: str) -> str | None:
    """Why a run folder could not be made under `path` (None: it could), found without writing anything."""
    here = Path(path).absolute()
    while not here.exists():
        if here.is_symlink():
            return f"cannot be created: {here} is a broken link"
        here = here.parent
    if not here.is_dir():
        return f"cannot be created: {here} is not a folder"
    if not os.access(here, os.W_OK | os.X_OK):
        return f"cannot be created or written: {here} is not writable"
    return None


class World:
    """The checks of a run's config that need the machine, and what they built: the run's env bundle, with its
    tools and reward sources, which the assembly takes (`assemble(cfg, env=world.env)`) so that the process
    resolves them once and the run uses the very object its startup check saw."""

    def __init__(self):
        self.env: EnvBundle | None = None

    def problems(self, cfg: TrainConfig) -> list[str]:
        """Every problem of `cfg` that only the machine it runs on can show, one line each, naming the field;
        `self.env` is the run's bundle when none stands in its way."""
        sources = source_problems(cfg)
        p = folder_problems(cfg) + sources + estimator_problems(cfg) + teacher_problems(cfg) + opponent_problems(cfg)
        whole = not sources  # the tools and reward files load: build the bundle with them, else check the env alone
        spec = env_spec(cfg) if whole else replace(env_spec(cfg), tools=None)
        self.env = None
        try:
            env = load_bundle(spec, rewards=whole)  # imports the env's module
        except EnvSpecError as e:
            p.append(f"{'agent' if cfg.agent else 'env'}: {e}")
        else:
            self.env = env if whole else None
            if cfg.agent and cfg.tasks is None:
                p.append("tasks: an --agent run has no default tasks; give --tasks (e.g. calc:count=2000,seed=1)")
            elif cfg.tasks is None and not env.default_tasks:
                p.append(f"tasks: the env {cfg.env!r} has no default tasks (EnvBundle.default_tasks); give --tasks")
        return p


def world_problems(cfg: TrainConfig) -> list[str]:
    """`World().problems(cfg)`, for a command line whose bundle is not run (tools that only check a config)."""
    return World().problems(cfg)


def folder_problems(cfg: TrainConfig) -> list[str]:
    """The output folder can be made, the metric sinks named are installed, and a run with child processes
    can start their server under TMPDIR."""
    from nanorllm.utils.sinks import parse_report_to

    p = []
    if (why := unwritable_dir(cfg.output_dir)) is not None:
        p.append(f"output_dir: {cfg.output_dir!r} {why}")
    if _starts_children(cfg) and (why := socket_folder_problem()) is not None:
        p.append(why)
    try:
        if "wandb" in parse_report_to(cfg.report_to) and importlib.util.find_spec("wandb") is None:
            p.append("report_to: wandb is not installed (pip install -e .[wandb], or pip install wandb)")
    except ValueError:
        pass  # config_problems names it
    return p


def _starts_children(cfg: TrainConfig) -> bool:
    """Whether the run starts rollout workers or learner ranks (forks of its fork server)."""
    try:
        return not cfg.serial or len(run_devices(cfg).learners) > 1
    except DeviceError:
        return not cfg.serial  # the device check names it


def source_problems(cfg: TrainConfig) -> list[str]:
    """Each reward source's own start-up checks (rewards/sources.py: a --reward file loads, the --reward-model folder
    is a sequence classifier, the --judge can be asked), and the --tools functions have schemas."""
    from nanorllm.rewards.sources import reward_source_problems, reward_source_specs

    p = reward_source_problems(reward_source_specs(cfg))
    if cfg.tools and not cfg.agent:
        from nanorllm.envs.tools import load_tools

        try:
            load_tools(cfg.tools)  # imports the file and builds each function's schema: a bad one stops here
        except EnvSpecError as e:
            p.append(f"tools: {e}")
    return p


def estimator_problems(cfg: TrainConfig) -> list[str]:
    """A user's --adv-estimator spec imports and names a function (imported and registered here, as each process
    that computes advantages does again)."""
    from nanorllm.algos.advantages import estimator_named, estimator_problem

    if estimator_problem(cfg.adv_estimator):
        return []  # an unknown name: the config's own check names it
    try:
        estimator_named(cfg.adv_estimator)
    except ValueError as e:
        return [f"adv_estimator: {e}"]
    return []


def teacher_problems(cfg: TrainConfig) -> list[str]:
    """The --teacher shares the student's tokenizer (read from both tokenizers, before any weights load)."""
    from nanorllm.trainer.teacher import vocabulary_problem

    problem = vocabulary_problem(cfg.model, cfg.teacher) if cfg.teacher is not None else None
    return [problem] if problem else []


def opponent_problems(cfg: TrainConfig) -> list[str]:
    """A model --opponent or --eval-opponent is one whose config this machine reads (before any weights load); an
    endpoint's URL has a host. --eval-opponent base is --model, checked as the run's model is."""
    return opponent_problem("opponent", cfg.opponent) + eval_opponent_problems(cfg)


def eval_opponent_problems(cfg) -> list[str]:
    """Why --eval-opponent cannot play (one line), or []: `base` is --model, checked as the run's model is."""
    return opponent_problem("eval_opponent", cfg.eval_opponent) if cfg.eval_opponent != "base" else []


def opponent_problem(field: str, name: str) -> list[str]:
    """Why the opponent `name` given for `field` cannot play (one line), or []."""
    from urllib.parse import urlparse

    from nanorllm.memory.plan import model_config
    from nanorllm.policy.chat_endpoint import is_endpoint
    from nanorllm.rollout.games import MODEL_FREE, OPPONENTS
    from nanorllm.rollout.opponent_pool import NOT_FOR_EVAL

    if is_endpoint(name):
        return [] if urlparse(name).hostname else [f"{field}: {name!r} names no host"]
    if field == "eval_opponent" and name == "pool":
        return [NOT_FOR_EVAL]
    if name in OPPONENTS or model_config(name) is not None:
        return []
    choices = (*MODEL_FREE, "base") if field == "eval_opponent" else OPPONENTS
    return [f"{field}: {name!r} is neither {', '.join(choices)}, an "
            "endpoint (http://host:port/v1) nor a model this machine can read (a folder with a config.json, a cached "
            "hub id, a built-in name)"]
