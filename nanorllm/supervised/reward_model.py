"""The reward-model program that launch/train_reward_model.py runs: every problem of its flags and of --data's rows
said at once (exit 2, nothing written, before any model loads), then one of its modes: make labelled rows
(--sample-from), turn them into pairs (--to-pairs), score a fitted model (--score), or fit one (docs/rewards.md)."""

import json
import sys
from dataclasses import replace

import tyro

from nanorllm.rewards.model import reward_model_problems
from nanorllm.supervised.data import RewardDataError, read_rows
from nanorllm.config.errors import ConfigError
from nanorllm.config.fit import FIT_DEFAULTS, FitConfig, problems
from nanorllm.supervised.fit import FitError, fit, fit_device, out_problems, score_rows, write_pairs
from nanorllm.supervised.labels import sample_rows
from nanorllm.trainer import checkpoint
from nanorllm.utils.precision import resolve as resolve_precision


def input_problems(cfg: FitConfig) -> list[str]:
    """The flags' problems, then the --score folder's, then --data's rows' (each stage only when the one before
    found none)."""
    bad = problems(cfg)
    if not bad and cfg.score is not None:
        bad = [f"score: {p}" for p in reward_model_problems(cfg.score)]
    if not bad and cfg.out is not None:
        bad = out_problems(cfg)
    if not bad and cfg.resume is not None and not checkpoint.list_complete(cfg.resume):
        bad = [f"resume: {cfg.resume!r} holds no checkpoint of a fit (checkpoints/step_<N>/)"]
    if not bad and cfg.data is not None:
        try:
            read_rows(cfg.data)
        except RewardDataError as e:
            bad = e.problems
    return bad


def run(cfg: FitConfig) -> None:
    """The mode the flags name; RewardDataError when --to-pairs finds no pair to make."""
    if not cfg.to_pairs and cfg.score is None:  # a mode that loads a model: --dtype auto chosen for its device
        cfg = replace(cfg, dtype=resolve_precision(cfg.dtype, fit_device(cfg)))
    if cfg.sample_from is not None:
        sample_rows(cfg)
    elif cfg.to_pairs:
        write_pairs(cfg)
    elif cfg.score is not None:
        print(json.dumps(score_rows(cfg)))
    else:
        fit(cfg)


def main(argv: list[str], description: str | None = None) -> int:
    """`python launch/train_reward_model.py ARGV`: the exit code (2: bad flags or rows, one line each; 1: a fit
    whose weights went non-finite, nothing saved, or none of --resume's checkpoints loads)."""
    cfg = tyro.cli(FitConfig, default=FitConfig(**FIT_DEFAULTS), args=argv, description=description)
    try:
        bad = input_problems(cfg)
        if not bad:
            run(cfg)
    except RewardDataError as e:
        bad = e.problems
    except ConfigError as e:  # the run folder cannot be made
        bad = e.problems
    except FileExistsError as e:  # the run folder is another run's, or in use
        bad = [str(e)]
    except (FitError, checkpoint.CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if bad:
        print("\n".join(f"error: {p}" for p in bad), file=sys.stderr)
        return 2
    return 0
