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
{"set", "spec", "success_rate", "first_turn_success", "mean_reward", "mean_turns", "n", "failed", "grader_timeouts",
"first_timeout_task"}, and with --eval-samples n "pass@k" for each k, "mean@n" and "sampled_failed" (in a game also
"sampled/selfplay/*": the sampled games' win, draw and invalid-move shares beside the greedy ones). As in training,
an episode whose score failed (a reward function, judge or env that raised, timed out or gave nan) is not a 0: the
rates are over the n scored episodes and "failed" counts the others.
"""

import sys

from nanorllm.run.evaluation import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], description=__doc__))
