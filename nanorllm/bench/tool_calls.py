"""What running --tools in a helper process costs (envs/tool_host.py) against a thread of the calling process (the
path tools took before, envs/timed.py, which --reward functions still take), on the calculator tool: the helper's
start (once per process, and again after a tool is killed) and one call, median of `calls` calls alternating.

    python -m nanorllm.bench.tool_calls [calls]   # 2000 by default; the calculator of --env calc, 37 * 52 - 64
"""

import statistics
import sys
import time

from nanorllm.utils.timed import call_with_limit
from nanorllm.envs.tool_host import ToolHost
from nanorllm.envs.tools import load_tools

SPEC = "nanorllm.envs.calc_tool:calc"
ARGUMENTS = {"expression": "37 * 52 - 64"}
TIMEOUT_S = 10.0


def compare(calls: int = 2000) -> dict:
    """{"start_s", "thread_us", "process_us", "ratio"}: the helper's start and one call on each path (medians)."""
    [tool] = load_tools(SPEC)
    host = ToolHost(SPEC)
    t0 = time.perf_counter()
    assert host.call("calc", ARGUMENTS, TIMEOUT_S) == ("1860", True)  # starts the helper
    start_s = time.perf_counter() - t0
    thread, process = [], []
    for _ in range(calls):
        t0 = time.perf_counter()
        call_with_limit(tool.fn, TIMEOUT_S, "tool:calc", **ARGUMENTS)
        t1 = time.perf_counter()
        host.call("calc", ARGUMENTS, TIMEOUT_S)
        t2 = time.perf_counter()
        thread.append(t1 - t0)
        process.append(t2 - t1)
    host.close()
    thread_us, process_us = statistics.median(thread) * 1e6, statistics.median(process) * 1e6
    return {"start_s": start_s, "thread_us": thread_us, "process_us": process_us, "ratio": process_us / thread_us}


def main(argv: list[str]) -> None:
    calls = int(argv[0]) if argv else 2000
    r = compare(calls)
    print(f"| path | one calc call (median of {calls}) |\n|---|---|\n"
          f"| a thread of the calling process | {r['thread_us']:.0f} us |\n"
          f"| the tools' helper process | {r['process_us']:.0f} us ({r['ratio']:.1f}x) |\n"
          f"helper start (once per process, and after each kill): {r['start_s'] * 1000:.0f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
