"""Loading task sets: synthetic arithmetic specs or JSONL files, validated before training starts.

A task is a plain dict {"task_id": str, "question": str, "answer": str}. `load_tasks` accepts
either an arithmetic spec ("arith:digits=2,count=500", see `nanorllm.datasets.arithmetic`) or
the path of a JSONL file in one of two formats, detected from the file's first JSON object:

- the seed schema: task_id, question, answer (answer may be a JSON number);
- GSM8K's own format: question, answer, where the answer is a worked solution whose final line
  is "#### N"; task ids are made from the file stem and line number.

A bad file is reported in full, one problem per bad line with file, line number and field, so
that it can be fixed in one pass instead of one crash at a time.
"""

import json
import math
import os
from pathlib import Path

from nanorllm.datasets.arithmetic import make_arithmetic_tasks, parse_arith_spec
from nanorllm.datasets.errors import TaskFileError
from nanorllm.datasets.golds import (extract_boxed, normalize_answer_text, number_text, question_value, task_columns,
                                     task_row)


def _is_arith_spec(spec: str) -> bool:
    return spec == "arith" or spec.startswith("arith:")


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _text_field(record: dict, key: str) -> tuple[str | None, str | None]:
    """(stripped value, None) for a usable string field, else (None, problem message)."""
    if key not in record:
        return None, f"field {key!r} is missing"
    value = record[key]
    if not isinstance(value, str):
        return None, f"field {key!r} must be a string, got {_type_name(value)}"
    if not value.strip():
        return None, f"field {key!r} is empty"
    return value.strip(), None


def _question_field(record: dict, key: str, *, chat: bool) -> tuple[str | list[dict] | None, str | None]:
    if key not in record:
        return None, f"field {key!r} is missing"
    question, problem = question_value(record[key], chat=chat)
    return question, problem and f"field {key!r} {problem}"


def _seed_answer(record: dict, key: str = "answer") -> tuple[str | None, str | None]:
    """The answer of a seed-schema record; JSON numbers become their decimal text."""
    value = record.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            return None, f"field {key!r} is not a finite number ({value})"
        return number_text(value), None
    if key in record and not isinstance(value, str):
        return None, f"field {key!r} must be a string or number, got {_type_name(value)}"
    return _text_field(record, key)


def _gsm8k_answer(record: dict, key: str = "answer", *, plain: bool = False) -> tuple[str | None, str | None]:
    """The final answer after the last "####" of a GSM8K solution text, else a MATH solution's last
    \\boxed{}; with `plain` (a mapped column) any other text or number is the answer itself."""
    if plain and key in record and not isinstance(record[key], str):
        return _seed_answer(record, key)
    solution, problem = _text_field(record, key)
    if problem:
        return None, problem
    if "####" not in solution:
        boxed = extract_boxed(solution)
        if boxed:
            return boxed, None
        if plain:
            return normalize_answer_text(solution), None
        return None, f"field {key!r} has no '#### <answer>' line"
    answer = normalize_answer_text(solution.rsplit("####", 1)[1])
    if not answer:
        return None, f"field {key!r} is empty after '####'"
    return answer, None


def read_records(path: Path, problems: list[tuple[int, str]]) -> list[tuple[int, dict]]:
    """(line number, object) for every line holding a JSON object; other lines become problems. Lines end at
    newlines alone (a U+2028 inside a string is text), and a line that is not UTF-8 is named, not raised."""
    records = []
    for line_no, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            byte = raw[err.start]
            problems.append((line_no, f"not valid UTF-8 (byte 0x{byte:02x} at offset {err.start})"))
            continue
        if not text.strip():
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            problems.append((line_no, f"invalid JSON ({err.msg} at column {err.colno})"))
            continue
        if not isinstance(value, dict):
            problems.append((line_no, f"expected a JSON object, got {_type_name(value)}"))
            continue
        records.append((line_no, value))
    return records


def _load_file(label: str, fields: dict[str, str] | None = None, *, gold: bool = True, chat: bool = False) -> list[dict]:
    path = Path(label)
    if not path.is_file():
        reason = "is not a file" if path.exists() else "file not found"
        raise TaskFileError(label, [f"{label}: {reason}"])
    problems: list[tuple[int, str]] = []
    try:
        records = read_records(path, problems)
    except OSError as err:
        raise TaskFileError(label, [f"{label}: cannot read file ({err.strerror or err})"]) from err
    if not records and not problems:
        raise TaskFileError(label, [f"{label}: no tasks (the file has no JSON records)"])

    col = task_columns(fields or {}, records[0][1] if records else {})
    gsm8k = bool(records) and col["task_id"] not in records[0][1]
    first_line = records[0][0] if records else 0
    tasks = []
    id_lines: dict[str, int] = {}
    for line_no, record in records:
        found = []
        question, problem = _question_field(record, col["question"], chat=chat)
        found.append(problem)
        if gsm8k:
            if col["task_id"] in record:
                found.append(
                    f"field {col['task_id']!r} is present, but line {first_line} has none "
                    "so the file was read as GSM8K format"
                )
            task_id = f"{path.stem}-{line_no:05d}"
            answer, problem = (None, None) if not gold and col["answer"] not in record else \
                _gsm8k_answer(record, col["answer"], plain=bool(fields))
        else:
            task_id, problem = _text_field(record, col["task_id"])
            found.append(problem)
            if task_id is not None:
                if task_id in id_lines:
                    found.append(
                        f"field {col['task_id']!r} duplicates line {id_lines[task_id]} ({task_id!r})"
                    )
                else:
                    id_lines[task_id] = line_no
            answer, problem = (None, None) if not gold and col["answer"] not in record else \
                _seed_answer(record, col["answer"])
        found.append(problem)
        found = [p for p in found if p]
        if found:
            problems.extend((line_no, p) for p in found)
        else:  # the file's own columns stay beside the three the env reads (reward functions see them)
            tasks.append(task_row(record, task_id, question, answer))
    if problems:
        problems.sort(key=lambda item: item[0])
        raise TaskFileError(label, [f"{label}:{line_no}: {p}" for line_no, p in problems])
    return tasks


def load_tasks(spec: str, *, limit: int | None = None, fields: dict[str, str] | None = None, gold: bool = True,
               chat: bool = False) -> list[dict]:
    """Tasks from an arithmetic spec ("arith", "arith:..."), a JSONL file, or a source the `datasets`
    library reads (parquet, CSV, a JSON array, an Arrow folder, a folder of such files, hf:NAME...;
    nanorllm/datasets/hf_tasks.py). `fields` maps question / answer / task_id to the source's own columns;
    every other column of a row is kept in its task. Without `gold` a source may have no answer column
    (a prompt-only dataset, scored by reward functions alone: its tasks have no "answer"); with `chat` a
    question may be a list of chat messages (a conversational prompt, golds.question_value).

    A file is validated in full before anything is returned: every problem found is collected
    into one TaskFileError. `limit` keeps the first N tasks.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    spec = os.fspath(spec)
    if _is_arith_spec(spec):
        params = parse_arith_spec(spec)
        if limit is not None:
            params["count"] = min(params["count"], limit)
        return make_arithmetic_tasks(**params)
    from nanorllm.datasets import hf_tasks  # imports `datasets` itself only for a source that needs it

    if hf_tasks.is_datasets_source(spec):
        return hf_tasks.load_dataset_tasks(spec, limit=limit, fields=fields, gold=gold, chat=chat)
    tasks = _load_file(spec, fields, gold=gold, chat=chat)
    return tasks if limit is None else tasks[:limit]


def check_task_rows(rows: list[dict], source: str) -> list[dict]:
    """Any env's task rows: dicts with a unique, non-empty string task_id (all problems at once)."""
    if not isinstance(rows, list):
        raise TaskFileError(source, [f"{source}: the env's load_tasks must return a list of task dicts, got "
                                     f"{_type_name(rows)}"])
    problems, seen = [], {}
    for i, row in enumerate(rows):
        task_id = row.get("task_id") if isinstance(row, dict) else None
        if not isinstance(row, dict):
            problems.append(f"{source}: row {i}: expected a dict, got {_type_name(row)}")
        elif not isinstance(task_id, str) or not task_id:
            problems.append(f"{source}: row {i}: 'task_id' must be a non-empty string, got {task_id!r}")
        elif task_id in seen:
            problems.append(f"{source}: row {i}: 'task_id' duplicates row {seen[task_id]} ({task_id!r})")
        else:
            seen[task_id] = i
    if not rows:
        problems.append(f"{source}: no tasks")
    if problems:
        raise TaskFileError(source, problems)
    return rows


def _normalize_question(text) -> str | None:
    """The question as the overlap check compares it; None for no text, or an empty one (a task whose opening is
    not its question: a verifiers taskset whose scripted user opens the conversation), which says nothing."""
    return (" ".join(text.lower().split()) or None) if isinstance(text, str) else None


OVERLAP_RULE = ("a training task is held out when its task_id, or its question (case and spacing aside; an empty "
                "one never), is a held-out task's")


def remove_overlap(train: list[dict], heldout: list[dict]) -> tuple[list[dict], int]:
    """Training tasks that share neither question nor task_id with the held-out set (`OVERLAP_RULE`).

    Questions are compared lowercased with whitespace collapsed, so a held-out problem copied
    with different spacing or capitals is still dropped. Returns (kept tasks, number dropped).
    Rows without a question, or with an empty one, compare by task_id alone.
    """
    held_questions = {_normalize_question(t.get("question")) for t in heldout} - {None}
    held_ids = {t["task_id"] for t in heldout}
    kept = [
        t
        for t in train
        if t["task_id"] not in held_ids and _normalize_question(t.get("question")) not in held_questions
    ]
    return kept, len(train) - len(kept)


def overlap_counts(train: list[dict], heldout: list[dict]) -> str:
    """Which key removed training tasks: "N by task_id, M by question alone" (for a message)."""
    held_ids = {t["task_id"] for t in heldout}
    kept = {id(t) for t in remove_overlap(train, heldout)[0]}
    by_id = sum(t["task_id"] in held_ids for t in train)
    by_question = sum(id(t) not in kept and t["task_id"] not in held_ids for t in train)
    return f"{by_id} by task_id, {by_question} by question alone"
