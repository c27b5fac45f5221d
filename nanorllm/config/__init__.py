"""The run's configuration as data: one `TrainConfig`, its fields grouped (fields.py), pure checks (checks.py),
the --config file loader (files.py), the command line (cli.py) and the small specs lower floors take
(specs.py). Checks that need the world (a user's env or reward file, the output folder, wandb) are the
run's assembly's: nanorllm/run/world.py.
"""

from nanorllm.config.checks import DEFAULT_ENV, NO_LIMIT_FIELDS, eval_problems
from nanorllm.config.cli import TRAIN_DESCRIPTION, format_config, parse_config
from nanorllm.config.errors import ConfigError
from nanorllm.config.fields import EvalSettings, TrainConfig
from nanorllm.config.files import ConfigFile, convert_field, load_config_file, read_config_file

__all__ = ["DEFAULT_ENV", "NO_LIMIT_FIELDS", "TRAIN_DESCRIPTION", "ConfigError", "ConfigFile", "EvalSettings",
           "TrainConfig", "convert_field", "eval_problems", "format_config", "load_config_file",
           "parse_config", "read_config_file"]
