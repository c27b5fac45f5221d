"""This process's resident memory, in bytes: its peak so far and now (Linux)."""

import os
import resource


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def rss_now_bytes() -> int:
    """Resident bytes now (the peak of a process is often its model load's transient)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
