"""launch/train.py's command line: a config, or a run to resume with the flags that change it.

Resume parsing reads the run's saved config (or the newest intact checkpoint's), so it needs the
checkpoint module; it lives here, above both, so that `nanorllm.config` imports nothing of the
trainer. The config's checks that need the world (run/world.py) are handed to the parser here, so the
command line reports them beside the config's own.
"""

from dataclasses import asdict
from pathlib import Path

from nanorllm.config import ConfigError, TrainConfig, parse_config
from nanorllm.envs.base import EnvBundle
from nanorllm.run.world import World


def parse_train_args(argv: list[str]) -> tuple[TrainConfig, str | None, dict, EnvBundle]:
    """launch/train.py's flags: (config, run dir to resume or None, fields overridden on resume, the run's env
    bundle as its checks built it). On resume the run's saved config.json is the base the flags change (when it
    is unreadable, the newest intact checkpoint's config: checkpoint.saved_config)."""
    world = World()
    if "--resume" not in argv:
        return parse_config(argv, world=world.problems), None, {}, world.env
    from nanorllm.trainer.checkpoint import CheckpointError, saved_config  # torch and transformers: only a resume

    i = argv.index("--resume")
    if i + 1 >= len(argv):
        raise ConfigError(["resume: needs a run directory"], "command-line flags")
    resume_dir, rest = argv[i + 1], argv[:i] + argv[i + 2:]
    if not Path(resume_dir).is_dir():
        raise ConfigError([f"resume: {resume_dir} is not a run folder"], "command-line flags")
    try:
        saved_fields, source = saved_config(Path(resume_dir))
    except CheckpointError as e:
        raise ConfigError([f"resume: {e}"], "command-line flags") from None
    if source != str(Path(resume_dir) / "config.json"):
        print(f"[resume] config from {source}", flush=True)
    saved = TrainConfig.from_saved(saved_fields)
    cfg = parse_config(rest, base=saved, world=world.problems)
    overrides = {k: v for k, v in asdict(cfg).items() if asdict(saved)[k] != v}
    return cfg, resume_dir, overrides, world.env
