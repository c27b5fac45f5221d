"""Evaluate a model greedily on an env's tasks (math self-refine by default) with the training episodes.

    python launch/eval.py --model runs/<run>/final_model      # the run's env, turns, rewards and held-out tasks
    python launch/eval.py --model runs/<run>/final_model --tasks arith:digits=1,terms=3,count=200,seed=2
    python launch/eval.py --model smollm2-135m-instruct --tasks ../shared/data/gsm8k/train.jsonl --eval-limit 100
    GEMINI_API_KEY=... python launch/eval.py --model gemini:gemini-2.5-flash --tasks tasks.jsonl
    python launch/eval.py --env calc --tasks calc:count=200,seed=2 --max-turns 3 --max-new-tokens 48

    python launch/eval.py --tasks data.parquet --task-fields question=problem,answer=solution --eval-samples 8 \
        --eval-set gsm8k=../shared/data/gsm8k/test.jsonl

The flags are training's for the same settings (--eval-limit, --threads, --max-turns, --env-arg ...). Prints one
JSON line per set ("set": the spec of --tasks or of the env's default held-out set, then each --eval-set's name):
{"set", "spec", "success_rate", "first_turn_success", "mean_reward", "mean_turns", "n", "grader_timeouts",
"first_timeout_task"}, and with --eval-samples n "pass@k" for each k and "mean@n".
"""

import json
import sys

import tyro

from nanorllm.datasets.tasks import TaskFileError
from nanorllm.envs.registry import EnvSpecError
from nanorllm.trainer.eval_model import EvalConfig, evaluate_model, given_fields, with_run_settings


def main(argv: list[str]) -> int:
    cfg, line = with_run_settings(tyro.cli(EvalConfig, args=argv, description=__doc__), given_fields(argv))
    if line:
        print(line, file=sys.stderr)
    try:
        result = evaluate_model(cfg)
    except (TaskFileError, EnvSpecError, ValueError) as e:  # bad task spec or env: before the model loads
        print(f"error: {e}", file=sys.stderr)
        return 2
    sets = result.pop("sets", {})
    for name, row in {result["spec"]: result, **sets}.items():
        print(json.dumps({"set": name, **row}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
