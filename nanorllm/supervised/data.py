"""The rows a reward model is fitted on, read and checked: one JSON object a line, every row of one kind.

    {"prompt": ..., "response": ..., "label": 0 or 1}     labelled: a 1-logit head fitted by BCE
    {"prompt": ..., "chosen": ..., "rejected": ...}       preference pairs: Bradley-Terry, -log sigmoid(r_c - r_r)

A prompt is text or a list of chat messages ({"role", "content"}), as a task's question is. The file is read as a
tasks file is (datasets/tasks.py read_records: a U+2028 inside a string does not end a line, a line that is not
UTF-8 is named). Every bad row is named with its file, line and field, all at once (RewardDataError), before
anything loads; a pair whose chosen and rejected are the same text is one (it ranks nothing).
"""

import json
from pathlib import Path

from nanorllm.datasets.tasks import read_records

KINDS = {"labelled": ("prompt", "response", "label"), "pairs": ("prompt", "chosen", "rejected")}


class RewardDataError(ValueError):
    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def row_kind(row: dict) -> str | None:
    return next((k for k, keys in KINDS.items() if all(f in row for f in keys)), None)


def row_problems(row: dict, where: str, kind: str | None) -> list[str]:
    got = row_kind(row)
    if got is None:
        return [f"{where}: field {f!r}: missing (a row is {{prompt, response, label}} or {{prompt, chosen, rejected}})"
                for f in (KINDS["pairs"] if "chosen" in row or "rejected" in row else KINDS["labelled"])
                if f not in row]
    if kind is not None and got != kind:
        return [f"{where}: a {got} row in a file of {kind} rows (the first row decides)"]
    p = []
    prompt = row["prompt"]
    if not (isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("content"), str) and isinstance(m.get("role"), str)
            for m in prompt))):
        p.append(f"{where}: field 'prompt': must be text or a list of {{role, content}} messages")
    for f in KINDS[got][1:]:
        if f == "label":
            if isinstance(row[f], bool) or row[f] not in (0, 1):
                p.append(f"{where}: field 'label': must be 0 or 1, got {row[f]!r}")
        elif not isinstance(row[f], str):
            p.append(f"{where}: field {f!r}: must be text, got {type(row[f]).__name__}")
    if got == "pairs" and row["chosen"] == row["rejected"]:
        p.append(f"{where}: fields 'chosen' and 'rejected' are the same text (a pair must rank two responses)")
    return p


def read_rows(path: str) -> tuple[str, list[dict]]:
    """(the rows' kind, the rows) of a JSONL file; RewardDataError naming every bad line and field."""
    lines: list[tuple[int, str]] = []
    try:
        records = read_records(Path(path), lines)
    except OSError as e:
        raise RewardDataError([f"{path}: cannot be read: {e.strerror}"]) from e
    rows, kind = [], None
    problems = [(n, f"{path}:{n}: {p}") for n, p in lines]
    for n, row in records:
        bad = row_problems(row, f"{path}:{n}", kind)
        problems += [(n, p) for p in bad]
        if not bad:
            kind = kind or row_kind(row)
            rows.append(row)
    if not rows and not problems:
        problems.append((0, f"{path}: no rows"))
    if problems:
        raise RewardDataError([p for _, p in sorted(problems, key=lambda item: item[0])])
    return kind, rows


def pairs_from_labelled(rows: list[dict], per_prompt: int) -> list[dict]:
    """Preference pairs of the same prompt from labelled rows: each response labelled 1 against each labelled 0 of
    that prompt (identical texts once, first seen first), at most `per_prompt` a prompt; a prompt without both labels
    gives none. Prompts keep the order they first appear in."""
    by: dict[str, tuple[list, list]] = {}
    for r in rows:
        key = json.dumps(r["prompt"])  # a prompt of chat messages is a list: keyed by its JSON
        by.setdefault(key, ([], []))[0 if r["label"] == 1 else 1].append(r)
    out = []
    for good, bad in by.values():
        chosen = list({r["response"]: r for r in good}.values())
        rejected = list({r["response"]: r for r in bad}.values())
        out += [{"prompt": c["prompt"], "chosen": c["response"], "rejected": w["response"]}
                for c in chosen for w in rejected][:per_prompt]
    return out
