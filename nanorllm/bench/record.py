"""A benchmark run's record: date, machine, command, time and figures, written as JSON."""

import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch


def median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2] if xs else float("nan")


def record_run(figures: dict, t_start: float, json_path: str | None, **fields) -> dict:
    """The run's record (date, machine, command, time, figures), written to `json_path` when given."""
    record = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), **fields,
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
              f"torch {torch.__version__}, cuda {torch.cuda.is_available()}",
              "command": " ".join(sys.argv), "total_s": time.perf_counter() - t_start, "figures": figures}
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(record, indent=2, default=float) + "\n")
    print(f"[bench] {record['total_s']:.0f} s")
    return record
