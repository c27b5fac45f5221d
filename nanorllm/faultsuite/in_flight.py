"""The requests a stub server holds open, counted exactly, for the tests that bound a client's concurrency
(faultsuite/stub_judge.py, the Gemini stub of tests/test_gemini.py).

A request leaves the count before the first byte of its reply is sent. A client opens its next request only once
it has a reply, so the count never exceeds what the client holds open; counted after the reply, a busy machine lets
the next request arrive before the count drops, and a client that kept its bound reads as one that broke it.

`hold_until=n` holds every request until n were open at once: a test that wants to see n concurrent requests
waits on that event, not on a delay it hopes is long enough for them to overlap.
"""

import threading

HOLD_S = 60.0  # how long a held request waits for its company: only a client that never opens n at once waits it


class InFlight:
    """`now`: requests open; `most`: the most open at once."""

    def __init__(self, hold_until: int | None = None, hold_s: float = HOLD_S):
        self.hold_until, self.hold_s = hold_until, hold_s
        self.now = self.most = 0
        self._changed = threading.Condition()

    def enter(self) -> None:
        with self._changed:
            self.now += 1
            self.most = max(self.most, self.now)
            self._changed.notify_all()

    def hold(self) -> None:
        """Return once `hold_until` requests were open at once, or after `hold_s` (then `most` says it never
        happened, and no later request waits again)."""
        with self._changed:
            if self.hold_until is not None and not self._changed.wait_for(lambda: self.most >= self.hold_until,
                                                                          self.hold_s):
                self.hold_until = None

    def leave(self) -> None:
        """Before the reply's first byte."""
        with self._changed:
            self.now -= 1
