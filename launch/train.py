"""Train a causal LM with GRPO on multi-turn math self-refine episodes.

    python launch/train.py                          # default model and tasks, pipeline (1 worker)
    python launch/train.py --serial                 # everything in this process (debug path)
    python launch/train.py --num-workers 3 --devices cuda:0,cuda:1,cuda:2,cuda:3
    python launch/train.py --config my.yaml --max-steps 100
    python launch/train.py --resume runs/<run>      # continue the last complete checkpoint

Ctrl-C / SIGTERM: the current update finishes (or the current rollout is abandoned), a checkpoint
is written, worker processes exit, shared memory is released.
"""

import json
import signal
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nanorllm.config import ConfigError, TrainConfig, parse_config  # noqa: E402
from nanorllm.datasets.tasks import TaskFileError  # noqa: E402
from nanorllm.trainer.checkpoint import CheckpointError  # noqa: E402
from nanorllm.trainer.loop import SerialSource, TrainingRun  # noqa: E402


def parse_args(argv: list[str]) -> tuple[TrainConfig, str | None, dict]:
    """(config, run dir to resume or None, fields overridden on resume)."""
    if "--resume" not in argv:
        return parse_config(argv), None, {}
    i = argv.index("--resume")
    if i + 1 >= len(argv):
        raise ConfigError(["resume: needs a run directory"], "command-line flags")
    resume_dir, rest = argv[i + 1], argv[:i] + argv[i + 2:]
    saved_path = Path(resume_dir) / "config.json"
    if not saved_path.exists():
        raise ConfigError([f"resume: {saved_path} not found"], "command-line flags")
    saved = TrainConfig(**json.loads(saved_path.read_text()))
    cfg = parse_config(rest, base=saved)
    overrides = {k: v for k, v in asdict(cfg).items() if asdict(saved)[k] != v}
    return cfg, resume_dir, overrides


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg, resume_dir, overrides = parse_args(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    run = TrainingRun(cfg, resume_dir=resume_dir, overrides=overrides)
    source = None

    def on_signal(signum, frame):
        print(f"\n[signal] {signal.Signals(signum).name}: stopping after the current update", flush=True)
        run.stop_requested = True
        if not run.in_update:
            raise KeyboardInterrupt

    summary = {}
    try:
        run.setup()
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        run.evaluate_before()
        run.use_cores(alone=False)
        if cfg.serial:
            source = SerialSource(run)
        else:
            from nanorllm.pipeline.learner import PipelineSource
            source = PipelineSource(run)
        run.train(source)
    except (TaskFileError, ConfigError, CheckpointError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        run.stop_requested = True
    finally:
        if source is not None:
            source.close()  # workers are gone before the final eval takes every core
        if hasattr(run, "policy"):
            run.use_cores(alone=True)
            summary = run.finish(interrupted=run.stop_requested)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        run.cleanup()
    if run.stop_requested:
        print(f"[stopped] checkpoint under {run.run_dir / 'checkpoints'}; continue with --resume {run.run_dir}")
        return 130
    if "before" in summary and "after" in summary:
        b, a = summary["before"]["success_rate"], summary["after"]["success_rate"]
        print(f"[done] held-out success {b:.3f} -> {a:.3f} ({a - b:+.3f}) on {summary['after']['n']} tasks | "
              f"{run.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
