"""The evaluation program that launch/eval.py runs: a model evaluated greedily on an env's tasks, the settings of
the run that wrote it where no flag gives them, one JSON line per set printed; a bad task spec or env is refused in
one line with exit 2, before the model loads. A rate over no scored episode is null, with "why_null" beside it."""

import json
import sys

import tyro

from nanorllm.datasets.tasks import TaskFileError
from nanorllm.run.world import eval_opponent_problems
from nanorllm.trainer.eval_model import EvalConfig, evaluate_model, given_fields, with_run_settings
from nanorllm.trainer.evaluate import json_ready
from nanorllm.utils.modules import EnvSpecError


def main(argv: list[str], description: str | None = None) -> int:
    """`python launch/eval.py ARGV`: the exit code (2: bad input, one line)."""
    cfg, line = with_run_settings(tyro.cli(EvalConfig, args=argv, description=description), given_fields(argv))
    if line:
        print(line, file=sys.stderr)
    try:
        if problems := eval_opponent_problems(cfg):
            raise ValueError("; ".join(problems))  # a model it cannot read: before --model loads
        result = evaluate_model(cfg)
    except (TaskFileError, EnvSpecError, ValueError) as e:  # bad task spec or env: before the model loads
        print(f"error: {e}", file=sys.stderr)
        return 2
    sets = result.pop("sets", {})
    for name, row in {result["spec"]: result, **sets}.items():
        print(json.dumps({"set": name, **json_ready(row)}))
    return 0
