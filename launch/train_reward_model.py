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

import json
import sys

import tyro

from nanorllm.rewards.model import reward_model_problems
from nanorllm.supervised.data import RewardDataError, read_rows
from nanorllm.supervised.fit import FitConfig, FitError, fit, out_problems, problems, score_rows, write_pairs


def main(argv: list[str]) -> int:
    cfg = tyro.cli(FitConfig, args=argv, description=__doc__)
    bad = problems(cfg)
    if not bad and cfg.score is not None:
        bad = [f"score: {p}" for p in reward_model_problems(cfg.score)]
    if not bad and cfg.out is not None:
        bad = out_problems(cfg)
    if not bad and cfg.data is not None:
        try:
            read_rows(cfg.data)
        except RewardDataError as e:
            bad = e.problems
    if bad:
        print("\n".join(f"error: {p}" for p in bad), file=sys.stderr)
        return 2
    if cfg.sample_from is not None:
        from nanorllm.supervised.labels import sample_rows

        sample_rows(cfg)
    elif cfg.to_pairs:
        try:
            write_pairs(cfg)
        except RewardDataError as e:
            print("\n".join(f"error: {p}" for p in e.problems), file=sys.stderr)
            return 2
    elif cfg.score is not None:
        print(json.dumps(score_rows(cfg)))
    else:
        try:
            fit(cfg)
        except FitError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
