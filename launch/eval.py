"""Evaluate a model on math tasks with the same multi-turn self-refine loop, greedily.

    python launch/eval.py --model runs/<run>/final_model --tasks arith:digits=1,terms=3,count=200,seed=2
    python launch/eval.py --model smollm2-135m-instruct --tasks ../shared/data/gsm8k/train.jsonl --limit 100
    GEMINI_API_KEY=... python launch/eval.py --model gemini:gemini-2.5-flash --tasks tasks.jsonl

Prints one JSON line: {"success_rate", "first_turn_success", "mean_turns", "n", "grader_timeouts",
"first_timeout_task"}.
"""

import json
import sys

import tyro

from nanorllm.datasets.tasks import TaskFileError
from nanorllm.trainer.eval_model import EvalConfig, evaluate_model


def main(argv: list[str]) -> int:
    try:
        result = evaluate_model(tyro.cli(EvalConfig, args=argv))
    except TaskFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
