"""Rejection sampling: K episodes per task from a model on an env, the rewarded ones kept as SFT rows.

    python launch/sample.py --model smollm2-135m-instruct --env math --limit 200 --samples-per-task 8 \
        --out runs/rft.jsonl
    python launch/sft.py --model smollm2-135m-instruct --data runs/rft.jsonl --out runs/rft_model

Bad flags: one line each naming the flag; exit 2, nothing written.
"""

import sys

from nanorllm.supervised.rejection import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
