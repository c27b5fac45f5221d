"""Ctrl-C, SIGTERM and SIGHUP (the terminal closed) during a run: stop at a safe point, and let nothing
interrupt the save."""

import signal
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator


@dataclass
class StopState:
    """What the stop signals and the loop share."""
    requested: bool = False  # a stop signal came: the loop stops at its next check
    committing: bool = False  # optimizer step .. end of the step's logs: a stop waits for it
    dirty: bool = False  # optimizer step .. final_step moved: the weights match no step number

    def updating(self, *_) -> None:
        """The optimizer's step pre-hook: from here the step is being committed, its weights no step's yet."""
        self.committing = self.dirty = True


class StopSignals:
    """SIGINT / SIGTERM / SIGHUP handling. Inside `interruptible()` the first signal raises KeyboardInterrupt
    where the run is, unless it is committing a step (then the loop stops after it); every other one is only
    noted, so nothing can interrupt the save."""

    EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}

    def __init__(self, stop: StopState):
        self.stop, self.signum, self.may_raise = stop, None, False
        self.previous = {s: signal.signal(s, self._on_signal) for s in self.EXIT_CODES}

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """The part of the run a first signal may cut short (none once a signal came); never the save."""
        self.may_raise = self.signum is None
        try:
            yield
        finally:
            self.may_raise = False

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            print(f"\n[signal] {name}: already stopping; the checkpoint is written first", flush=True)
            return
        self.signum = signum
        self.stop.requested = True
        if self.may_raise and not self.stop.committing:
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
