"""Where a run's start-up goes: the wall seconds from its process's start (or its first call) to its first step,
phase by phase, printed as one line so a slow start names its cause.

The phases are laps of one clock: each `lap(name)` gives the seconds since the previous lap to `name`, so the
phases add up to the whole by construction, and a phase nobody lapped cannot hide time. The origin is the
process's own start time (read from /proc, so the interpreter's start and every import count), or the moment
the clock was made for a run started from Python (a benchmark's run: its imports were paid before).
"""

import os
import time


def process_start() -> float | None:
    """This process's start as a `time.time()` value (from /proc/self/stat and /proc/uptime: 10 ms steps), or None
    where /proc cannot be read."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat: start time since boot, in ticks
    return time.time() - max(age, 0.0)


class StartupClock:
    """Laps from an origin: the seconds between consecutive `lap` calls, by phase name (a name lapped twice sums)."""

    def __init__(self, origin: float | None = None):
        self.origin = time.time() if origin is None else origin
        self.last = self.origin
        self.phases: dict[str, float] = {}

    def lap(self, phase: str) -> float:
        """Give the seconds since the previous lap (or the origin) to `phase`; returns them."""
        now = time.time()
        spent = max(now - self.last, 0.0)
        self.phases[phase] = self.phases.get(phase, 0.0) + spent
        self.last = now
        return spent

    @property
    def total(self) -> float:
        return sum(self.phases.values())

    def line(self, what: str = "the first step") -> str:
        """`[startup] 9.8 s to the first step: imports 4.1 | model 1.9 | ...` (phases in the order first lapped)."""
        parts = " | ".join(f"{name} {s:.1f}" for name, s in self.phases.items())
        return f"[startup] {self.total:.1f} s to {what}: {parts}"
