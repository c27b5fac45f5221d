"""Train a causal LM with GRPO on multi-turn math self-refine episodes.

    python launch/train.py                          # default model and tasks, pipeline (1 worker)
    python launch/train.py --serial                 # everything in this process (debug path)
    python launch/train.py --num-workers 3 --devices cuda:0,cuda:1,cuda:2,cuda:3
    python launch/train.py --config my.yaml --max-steps 100
    python launch/train.py --resume runs/<run>      # continue the last complete checkpoint

Ctrl-C / SIGTERM / SIGHUP (the terminal closed): the step in progress is abandoned (or, if its
optimizer step has begun, seen through), a checkpoint of the last completed step is written first,
then the workers are stopped; exit code 130 / 143 / 129. Further signals while that happens are
noted and ignored: they cannot skip the save. An error exits with 1 after the same save, printing
the original traceback; a finished run is only one that trained every step (final eval,
final_model/, exit 0). One process per run folder: a second one is refused (exit 2) naming the first.
The whole order: nanorllm/run/lifecycle.py.
"""

import sys

from nanorllm.run.prestart import start_workers_early
from nanorllm.utils.quick_exit import exit_now
from nanorllm.utils.startup import process_start


def main(argv: list[str]) -> int:
    start_workers_early(argv)  # the workers' imports run beside the launcher's own
    from nanorllm.run.lifecycle import main as run

    return run(argv, started=process_start())  # the start-up line counts the imports too


if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))
