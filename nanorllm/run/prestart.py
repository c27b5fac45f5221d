"""The launcher's first act: a run with rollout workers starts their fork server (utils/children.py) before
the launcher imports torch and transformers, so the server's imports of the same run beside them on another
core instead of after them (a tiny run's workers were ready ~3.4 s after its learner, waiting on them).

This looks at the flags quietly, with the config's own parser (light: no torch); anything it cannot read
starts nothing and is left to the run to report. A resumed run, a serial one, a memory plan alone and a
torchrun rank other than 0 start no server here (the first two start it later if their workers need it)."""

import contextlib
import io
import os

from nanorllm.config import ConfigError, parse_config
from nanorllm.utils.children import socket_folder_problem, start_server


def start_workers_early(argv: list[str]) -> None:
    if {"-h", "--help", "--resume"} & set(argv) or os.environ.get("RANK", "0") != "0":
        return
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cfg = parse_config(argv)
    except (ConfigError, SystemExit):
        return
    if not cfg.serial and not cfg.memory_plan_only and socket_folder_problem() is None:  # else the run names it
        start_server()
