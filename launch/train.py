"""Train a causal LM with GRPO on multi-turn math self-refine episodes.

    python launch/train.py                          # default model and tasks, pipeline (1 worker)
    python launch/train.py --serial                 # everything in this process (debug path)
    python launch/train.py --num-workers 3 --devices cuda:0,cuda:1,cuda:2,cuda:3
    python launch/train.py --config my.yaml --max-steps 100
    python launch/train.py --resume runs/<run>      # continue the last complete checkpoint

Ctrl-C / SIGTERM: the step in progress is abandoned (or, if its optimizer step has begun, seen
through), a checkpoint of the last completed step is written first, then the workers are stopped;
exit code 130 / 143. Further signals while that happens are noted and ignored: they cannot skip
the save. An error exits with 1 after the same save, printing the original traceback; a finished
run is only one that trained every step (final eval, final_model/, exit 0).
"""

import json
import os
import signal
import sys
import traceback
from dataclasses import asdict
from pathlib import Path

from nanorllm.config import ConfigError, TrainConfig, parse_config
from nanorllm.datasets.tasks import TaskFileError
from nanorllm.ranks.group import under_torchrun
from nanorllm.trainer.checkpoint import CheckpointError
from nanorllm.trainer.loop import SerialSource, TrainingRun
from nanorllm.utils.devices import DeviceError


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


class StopSignals:
    """SIGINT / SIGTERM handling. The first signal raises KeyboardInterrupt where the run is, unless
    it is committing a step (then the loop stops after it); every later one is only noted, so
    nothing can interrupt the save."""

    EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}

    def __init__(self, run: TrainingRun):
        self.run, self.signum, self.may_raise = run, None, True
        self.previous = {s: signal.signal(s, self._on_signal) for s in self.EXIT_CODES}

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            print(f"\n[signal] {name}: already stopping; the checkpoint is written first", flush=True)
            return
        self.signum = signum
        self.run.stop_requested = True
        if self.may_raise and not self.run.committing:
            self.may_raise = False
            print(f"\n[signal] {name}: stopping; checkpoint of the last completed step first", flush=True)
            raise KeyboardInterrupt
        print(f"\n[signal] {name}: noted; stopping once the step in hand is committed and saved", flush=True)

    @property
    def exit_code(self) -> int:
        return self.EXIT_CODES.get(self.signum, 130)

    def restore(self) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def _attempt(what: str, fn) -> None:
    """Run one shutdown action; an error in it is printed, never raised over the original one."""
    try:
        fn()
    except Exception:
        print(f"[shutdown] {what} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if under_torchrun() and int(os.environ["RANK"]) > 0:  # a learner rank other than 0: rank 0 runs the run
        from nanorllm.ranks.follower import follow_torchrun
        return follow_torchrun(argv)
    try:
        cfg, resume_dir, overrides = parse_args(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    run = TrainingRun(cfg, resume_dir=resume_dir, overrides=overrides)
    signals = StopSignals(run)
    source, outcome = None, "failed"
    try:
        run.setup()
        run.evaluate_before()
        run.use_cores(alone=False)
        if cfg.serial:
            source = SerialSource(run)
        else:
            from nanorllm.pipeline.learner import PipelineSource
            source = PipelineSource(run)
        run.train(source)
        signals.may_raise = False
        outcome = "stopped" if run.stop_requested else "done"
    except (TaskFileError, ConfigError, CheckpointError, FileExistsError, DeviceError) as e:
        signals.may_raise = False
        print(f"error: {e}", file=sys.stderr)
        outcome = "bad input"
    except KeyboardInterrupt:
        signals.may_raise = False
        outcome = "stopped"
    except BaseException:
        signals.may_raise = False
        traceback.print_exc()
        print("[failed] the run stopped on the error above", file=sys.stderr, flush=True)
    # Shutdown: save first (workers may still be running), then stop the workers, then the rest.
    if hasattr(run, "logger") and outcome != "bad input":
        _attempt("saving the checkpoint", run.save_last)
    if source is not None:
        _attempt("stopping the workers", source.close)  # gone before the final eval takes every core
    _attempt("stopping the learner ranks", run.ranks.close)
    summary = {}
    if outcome == "done":  # everything is saved: a signal may cut the final eval short
        signals.may_raise = signals.signum is None
        try:
            run.use_cores(alone=True)
            summary = run.finish()
        except KeyboardInterrupt:
            outcome = "stopped"
        except Exception:
            traceback.print_exc()
            outcome = "failed"
        signals.may_raise = False
    _attempt("closing the logs", run.cleanup)
    signals.restore()
    if outcome == "bad input":
        return 2
    if outcome == "stopped":
        print(f"[stopped] checkpoint under {run.run_dir / 'checkpoints'}; continue with --resume {run.run_dir}")
        return signals.exit_code
    if outcome == "failed":
        return 1
    if "before" in summary and "after" in summary:
        b, a = summary["before"]["success_rate"], summary["after"]["success_rate"]
        print(f"[done] held-out success {b:.3f} -> {a:.3f} ({a - b:+.3f}) on {summary['after']['n']} tasks | "
              f"{run.run_dir}")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is saved, closed and joined by now; skipping the interpreter's teardown of torch and
    # transformers (seconds on a loaded machine) keeps a stop inside a container's 10 s grace.
    os._exit(code)
