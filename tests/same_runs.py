"""Fingerprints of six tiny-random serial runs, one per program and RL variant, to show a change to the house
left behaviour alone: run it before and after, compare the two JSON files byte for byte.

    python tests/same_runs.py /tmp/before.json     # on the old tree (PYTHONPATH at it)
    python tests/same_runs.py /tmp/after.json
    cmp /tmp/before.json /tmp/after.json

Each run's fingerprint is the sha256 of every weights file it wrote and of its metrics.jsonl with the clock's
fields taken out (seconds, rates, timestamps, memory), so only what was learnt and measured in numbers counts.
"""

import contextlib
import hashlib
import io
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

CLOCK = ("time", "_s", "seconds", "per_s", "tok_s", "throughput", "wall", "rss", "mem", "timestamp", "elapsed")


def numbers(metrics: Path) -> str:
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    kept = [{k: v for k, v in row.items() if not any(c in k for c in CLOCK)} for row in rows]
    return json.dumps(kept, sort_keys=True)


def fingerprint(folder: Path) -> dict:
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.suffix in (".safetensors", ".bin", ".pt") and path.is_file():
            out[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        elif path.name == "metrics.jsonl":
            out[str(path.relative_to(folder))] = hashlib.sha256(numbers(path).encode()).hexdigest()[:16]
    return out


def quiet(main, argv) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(argv)


def rl(out: Path, name: str, args: list[str]) -> dict:
    from runs import train_in_process
    train_in_process(out, name, ["--max-steps", "3", "--save-every", "1", "--report-to", "jsonl", *args])
    return fingerprint(out / name)


def sft(out: Path) -> dict:
    from nanorllm.run.sft_program import main
    rows = out / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"What is {i} + {i}?", "completion": f"\\boxed{{{2 * i}}}"}) + "\n"
                            for i in range(8)))
    assert quiet(main, ["--model", "tiny-random", "--threads", "1", "--data", str(rows), "--rows-per-step", "3",
                        "--epochs", "2", "--lr", "1e-3", "--report-to", "jsonl", "--output-dir", str(out / "runs"),
                        "--run-name", "sft", "--out", str(out / "sft_model")]) == 0
    return {**fingerprint(out / "runs" / "sft"), **{f"out/{k}": v for k, v in fingerprint(out / "sft_model").items()}}


def reward_model(out: Path) -> dict:
    from nanorllm.supervised.reward_model import main
    rows = out / "labelled.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"is {i} even?", "response": "yes" if i % 2 else "no",
                                        "label": i % 2}) + "\n" for i in range(16)))
    assert quiet(main, ["--data", str(rows), "--model", "tiny-random", "--out", str(out / "rm"), "--epochs", "2",
                        "--lr", "1e-2", "--batch-size", "8", "--eval-frac", "0.25", "--max-tokens", "32",
                        "--output-dir", str(out / "runs")]) == 0
    return fingerprint(out / "rm")


def main(target: str) -> None:
    import torch
    torch.set_num_threads(1)
    from runs import LORA
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        prints = {"rl": rl(out, "rl", []), "lora": rl(out, "lora", LORA),
                  "teacher": rl(out, "teacher", ["--teacher", "tiny-random", "--distill-coef", "0.5"]),
                  "sft": sft(out), "reward_model": reward_model(out)}
    Path(target).write_text(json.dumps(prints, indent=1, sort_keys=True) + "\n")
    print(json.dumps(prints, indent=1, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1])
