"""Runs of one setting side by side (one per seed): held-out figures before and after, gains, mean and sample sd.

    python launch/seed_table.py runs/rg-letter-0 runs/rg-letter-1 runs/rg-letter-2
    python launch/seed_table.py runs/rg-spell-{0,1,2} --field success_rate --field reasoning_gym/solved \
        --field mean_reward --scalar reward/mean --json docs/x.json --plot docs/x.png

Prints a markdown table (one row per run, then the mean with the gain's sample sd); nanorllm/bench/seed_table.py
says where each figure comes from.
"""

import sys

import tyro

from nanorllm.bench.seed_table import SeedTableConfig, run_seed_table

if __name__ == "__main__":
    sys.exit(run_seed_table(tyro.cli(SeedTableConfig, description=__doc__)))
