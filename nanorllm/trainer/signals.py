"""Ctrl-C, SIGTERM and SIGHUP (the terminal closed) during a run: stop at a safe point, and let nothing
interrupt the save."""

import signal

from nanorllm.trainer.loop import TrainingRun


class StopSignals:
    """SIGINT / SIGTERM / SIGHUP handling. The first signal raises KeyboardInterrupt where the run is, unless
    it is committing a step (then the loop stops after it); every later one is only noted, so
    nothing can interrupt the save."""

    EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}

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
