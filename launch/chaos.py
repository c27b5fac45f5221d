"""Fault suite: every fault the pipeline promises to survive, against a real tiny-random run.

    python launch/chaos.py                        # every fault, a table, exit 1 on any miss (~8 min on 2 cores)
    python launch/chaos.py --only worker_hang,learner_kill
    python launch/chaos.py --soak-minutes 30      # one long run, a random worker SIGKILL/SIGSTOP every ~minute

What each fault does and what is counted: nanorllm/faultsuite/suite.py (the same functions are the pytest
fault tests, tests/test_faults.py); the soak: nanorllm/faultsuite/soak.py.
"""

import argparse
import sys
import tempfile
from pathlib import Path

from nanorllm.faultsuite.soak import run_soak
from nanorllm.faultsuite.suite import FAULTS, run_suite


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help=f"comma-separated subset of: {', '.join(FAULTS)}")
    ap.add_argument("--soak-minutes", type=float, help="run the soak instead of the fault table")
    ap.add_argument("--out", help="where the runs go (default: a temporary directory)")
    args = ap.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="nanorllm-chaos-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.soak_minutes:
        return run_soak(out, args.soak_minutes)
    return run_suite(out, args.only.split(",") if args.only else None)


if __name__ == "__main__":
    sys.exit(main())
