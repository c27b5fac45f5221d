"""Supervised fine-tuning on conversations, with the learner RL uses (docs/warm-start.md).

    python launch/sft.py --model tiny-random --data rows.jsonl --out runs/sft_model
    python launch/sft.py --env nanorllm.envs.calc_tool:CalcTasks --tools nanorllm/envs/calc_tool.py:calc \
        --demos 200 --out runs/calc_sft
    python launch/train.py --model runs/sft_model ...

Rows: TRL's `messages` (tool calls, role `tool`, a `tools` column) or `prompt`/`completion`, JSONL, parquet or
hf:NAME. Bad flags or rows: one line each naming the flag, or the file and line; exit 2, nothing written.
"""

import os
import sys

from nanorllm.run.sft import main

if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is saved and closed by now. Skipping the interpreter's teardown also skips freeing a lost
    # rank's process group, whose threads would wait for the interpreter lock the teardown holds.
    os._exit(code)
