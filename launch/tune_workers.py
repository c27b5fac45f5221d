"""Pick a worker count: a short timed trial for N = 1..K rollout workers, then a recommendation.

    python launch/tune_workers.py --max-workers 3                      # CPU: cores split across processes
    python launch/tune_workers.py --max-workers 7 --devices cuda:0,cuda:1,cuda:2,cuda:3,cuda:4,cuda:5,cuda:6,cuda:7
    python launch/tune_workers.py --max-workers 2 --device-count 8     # also: how to split 8 devices

Each trial is the real pipeline for a few learner updates; any other training flag (--model, --tasks,
--tasks-per-step ...) is passed through. How the recommendation and the device split are made:
nanorllm/bench/tune.py.
"""

import sys

from nanorllm.bench.tune import tune_workers
from nanorllm.config import ConfigError, parse_config
from nanorllm.run.world import world_problems


OWN_FLAGS = ("Pick a worker count: a timed trial of the pipeline for N = 1..K workers, then the flags to use. "
             "Its own flags: --max-workers K (3: the largest N tried), --trial-steps S (4: learner updates per "
             "trial), --device-count D (0: also say how to split D devices). Every training flag below is passed "
             "to the trials.")


def main(argv: list[str]) -> int:
    own = {"--max-workers": 3, "--trial-steps": 4, "--device-count": 0}
    argv = list(argv)
    for flag in own:
        if flag in argv:
            i = argv.index(flag)
            own[flag] = int(argv[i + 1])
            del argv[i:i + 2]
    try:
        base = parse_config(argv, description=OWN_FLAGS, world=world_problems)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return tune_workers(base, max_workers=own["--max-workers"], trial_steps=own["--trial-steps"],
                        device_count=own["--device-count"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
