"""Evaluate a model greedily on an env's tasks (math self-refine by default) with the training episodes.

    python launch/eval.py --model runs/<run>/final_model --tasks arith:digits=1,terms=3,count=200,seed=2
    python launch/eval.py --model smollm2-135m-instruct --tasks ../shared/data/gsm8k/train.jsonl --limit 100
    GEMINI_API_KEY=... python launch/eval.py --model gemini:gemini-2.5-flash --tasks tasks.jsonl
    python launch/eval.py --env calc --tasks calc:count=200,seed=2 --max-turns 3 --max-new-tokens 48

Prints one JSON line: {"success_rate", "first_turn_success", "mean_turns", "n", "grader_timeouts",
"first_timeout_task"}.
"""

import json
import sys

import tyro

from nanorllm.datasets.tasks import TaskFileError
from nanorllm.envs.registry import EnvSpecError
from nanorllm.trainer.eval_model import EvalConfig, evaluate_model


def main(argv: list[str]) -> int:
    try:
        result = evaluate_model(tyro.cli(EvalConfig, args=argv, description=__doc__))
    except (TaskFileError, EnvSpecError, ValueError) as e:  # bad task spec or env: before the model loads
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
