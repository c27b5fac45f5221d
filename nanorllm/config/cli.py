"""The command line: `--config FILE` first, then flags on top (parsed by tyro from TrainConfig, so every field is a
flag: `max_steps` is `--max-steps`), every problem of both reported at once; and the config as a table."""

import argparse
from dataclasses import asdict, replace
from typing import Callable

import tyro

from nanorllm.config.checks import DEFAULT_ENV, agent_env_problems, literal_fields
from nanorllm.config.episode_env import episode_env
from nanorllm.config.errors import ConfigError
from nanorllm.config.fields import TrainConfig
from nanorllm.config.files import load_config_file

TRAIN_DESCRIPTION = ("Train a causal LM with GRPO on multi-turn episodes of an environment (--env; math self-refine "
                     "by default). Also: --config FILE (JSON/YAML defaults), --resume RUN_DIR (continue a run).")


def parse_config(argv: list[str] | None = None, *, base: TrainConfig | None = None,
                 description: str = TRAIN_DESCRIPTION,
                 world: Callable[[TrainConfig], list[str]] | None = None) -> TrainConfig:
    """--config FILE first, then flags on top; validated before returning. Every problem of the file and of
    the flags is reported at once, with those `world(cfg)` finds (the run's checks of the env's module, the
    reward files, the output folder: nanorllm/run/world.py); one of a value the file set names the file and
    its line. `description` heads --help."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, rest = pre.parse_known_args(argv)
    resumed = base is not None  # a resumed run's saved config: its env stands
    base = base or TrainConfig()
    file = None
    if known.config:
        file = load_config_file(known.config)
        base = TrainConfig(**{**asdict(base), **file.values})
    env_flag = (file is not None and "env" in file.values) or any(a.split("=")[0] == "--env" for a in rest)
    base, rest, off_choice = _set_aside_off_choice(base, rest)
    cfg = tyro.cli(TrainConfig, default=base, args=rest, description=description)
    cfg = replace(cfg, **off_choice)
    cfg = replace(cfg, env=episode_env(cfg, env_given=resumed or env_flag))
    problems = cfg.validate()
    if cfg.env == DEFAULT_ENV:  # validate() sees only an env other than the default
        problems += agent_env_problems(cfg, env_given=env_flag)
    if world is not None:
        problems += world(cfg)
    if file is not None:
        from_file = {n for n, v in file.values.items() if getattr(cfg, n) == v}  # not changed by a flag
        problems = file.problems + [f"{p} ({file.where(p.split(':')[0])})" if p.split(":")[0] in from_file else p
                                    for p in problems]
    if problems:
        raise ConfigError(problems, known.config or "command-line flags")
    return cfg


def _set_aside_off_choice(base: TrainConfig, argv: list[str]) -> tuple[TrainConfig, list[str], dict]:
    """Values of Literal fields outside their choices, taken out of the file's config and the flags.

    tyro would stop at the first such flag; set aside and put back after parsing, they reach validate(),
    which reports them beside every other problem, naming the field.
    """
    choices = literal_fields(TrainConfig)
    off = {name: getattr(base, name) for name in choices if getattr(base, name) not in choices[name]}
    base = replace(base, **{name: getattr(TrainConfig, name) for name in off})
    flags = {"--" + name.replace("_", "-"): name for name in choices}
    kept, i = [], 0
    while i < len(argv):
        flag, eq, value = argv[i].partition("=")
        name = flags.get(flag.replace("_", "-"))
        if name is None or (not eq and i + 1 == len(argv)):
            kept.append(argv[i])
            i += 1
            continue
        value, used = (value, 1) if eq else (argv[i + 1], 2)
        if value in choices[name]:
            off.pop(name, None)  # a valid flag overrides an off-choice value from the file
            kept.extend(argv[i:i + used])
        else:
            off[name] = value
        i += used
    return base, kept, off


def format_config(cfg: TrainConfig) -> str:
    """A two-column table, for the console and TensorBoard's text tab."""
    rows = [f"|{k}|{v}|" for k, v in asdict(cfg).items()]
    return "|param|value|\n|-|-|\n" + "\n".join(rows)
