"""Looking at processes through /proc (Linux): who is left, who is whose child, how much memory.

The fault suite and the tests use these to check that a run leaves nothing behind.
"""

import os
from pathlib import Path


def processes_with_token(token: str) -> list[int]:
    """PIDs of live processes whose environment carries `token` (children survive their parent)."""
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if token.encode() in (p / "environ").read_bytes() and "State:\tZ" not in (p / "status").read_text():
                pids.append(int(p.name))
        except OSError:
            continue
    return pids


def children_of(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    out.append(int(p.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def descendants(pid: int) -> list[int]:
    out = []
    for child in children_of(pid):
        out += [child, *descendants(child)]
    return out


def name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def worker_pids(learner_pid: int) -> list[int]:
    """The learner's rollout worker processes (forks of its fork server, named by utils/children.py)."""
    return sorted(p for p in descendants(learner_pid) if name(p).startswith("nanorllm-worker"))


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def age_s(pid: int) -> float | None:
    """Seconds since the process started."""
    try:
        start_ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def shm_held() -> set[str]:
    """Names in /dev/shm whose file a live process has open or mapped (/proc/*/fd and /proc/*/maps), matched by
    inode: a POSIX named semaphore is mapped under the temporary name glibc created it as, before linking it to
    its own (a live process's multiprocessing Queue would otherwise look left behind)."""
    inodes = set()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            for fd in (p / "fd").iterdir():
                try:
                    if os.readlink(fd).startswith("/dev/shm/"):
                        inodes.add(os.stat(fd).st_ino)
                except OSError:  # closed since the listing
                    continue
            for line in (p / "maps").read_text().splitlines():
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
                    inodes.add(int(fields[4]))
        except OSError:  # gone, or not ours to read
            pass
    held = set()
    for name in shm_entries():
        try:
            if os.stat(f"/dev/shm/{name}").st_ino in inodes:
                held.add(name)
        except OSError:  # removed since the listing
            continue
    return held
