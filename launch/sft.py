"""Supervised fine-tuning on conversations, with the learner RL uses (docs/warm-start.md).

    python launch/sft.py --model tiny-random --data rows.jsonl --out runs/sft_model
    python launch/sft.py --env nanorllm.envs.calc_tool:CalcTasks --tools nanorllm/envs/calc_tool.py:calc \
        --demos 200 --out runs/calc_sft
    python launch/train.py --model runs/sft_model ...

Rows: TRL's `messages` (tool calls, role `tool`, a `tools` column) or `prompt`/`completion`, JSONL, parquet or
hf:NAME. Bad flags or rows: one line each naming the flag, or the file and line; exit 2, nothing written.
"""

import sys

from nanorllm.run.sft_program import main
from nanorllm.utils.quick_exit import exit_now

if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))
