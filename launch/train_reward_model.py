"""Fit a reward model that --reward-model loads (docs/rewards.md), or make its labelled data from the policy.

    python launch/train_reward_model.py --sample-from smollm2-135m-instruct --out runs/rm/data.jsonl \
        --limit 64 --samples-per-task 8
    python launch/train_reward_model.py --data runs/rm/data.jsonl --out runs/rm/model --epochs 2 --lr 1e-5
    python launch/train.py --env math --reward-model runs/rm/model --reward-mode add
    python launch/train_reward_model.py --data runs/rm/data.jsonl --to-pairs --out runs/rm/pairs.jsonl
    python launch/train_reward_model.py --score runs/rm/model --data runs/rm/pairs.jsonl   # accuracy, one JSON line

Rows: {"prompt", "response", "label"} (BCE on a 1-logit head) or {"prompt", "chosen", "rejected"} (Bradley-Terry).
Bad flags or rows: one line each naming the flag, or the file, line and field; exit 2, nothing written. A fit
whose weights go non-finite saves nothing (exit 1).
"""

import sys

from nanorllm.supervised.reward_model import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], description=__doc__))
