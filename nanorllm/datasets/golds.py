"""Gold answers as datasets hold them, and the `--task-fields` column mapping.

Datasets of this field keep the gold in one of three shapes: a plain value (`42`, `"\\frac{1}{2}"`), a
GSM8K worked solution ending in `#### 42`, or a MATH solution whose answer is its last `\\boxed{}`.
`gold_answer` reduces each to the answer text the grader compares against. The last-box rule lives
here, below the envs, so that the grader and the task readers find the same box.
"""

import math
import re

TASK_FIELDS = ("question", "answer", "task_id")  # what --task-fields may map

_THOUSANDS = re.compile(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?")


class TaskFieldsError(ValueError):
    pass


def extract_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (nested braces allowed); None if there is no closed box."""
    start = text.rfind("\\boxed{")
    while start != -1:
        i, depth = start + len("\\boxed{"), 1
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start + len("\\boxed{"): i - 1].strip()
        start = text.rfind("\\boxed{", 0, start)  # unclosed: fall back to an earlier, closed box
    return None


def normalize_answer_text(text: str) -> str:
    """Final-answer text without surrounding space or thousands separators ("1,000" -> "1000")."""
    text = text.strip()
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    return text


def number_text(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def gold_answer(value: object, *, plain: bool = True) -> tuple[str | None, str | None]:
    """(answer text, None) or (None, problem): a number as its decimal text, the text after a solution's last
    `####`, the content of its last closed `\\boxed{}`, else (with `plain`) the text itself."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            return None, f"not a finite number ({value})"
        return number_text(value), None
    if not isinstance(value, str):
        return None, f"must be a string or number, got {'null' if value is None else type(value).__name__}"
    if not value.strip():
        return None, "is empty"
    if "####" in value:
        answer = normalize_answer_text(value.rsplit("####", 1)[1])
        return (answer, None) if answer else (None, "is empty after '####'")
    boxed = extract_boxed(value)
    if boxed is not None:
        return (boxed, None) if boxed else (None, "has an empty \\boxed{}")
    if not plain:
        return None, "has no '#### <answer>' line"
    return normalize_answer_text(value), None


def task_columns(fields: dict[str, str], have) -> dict[str, str]:
    """{"question", "answer", "task_id"} -> the source's column for each: `fields` (--task-fields), else the
    same name; a source with no "question" but a "prompt" column (TRL's name for it) has its prompt read."""
    col = {k: fields.get(k, k) for k in TASK_FIELDS}
    if "question" not in fields and "question" not in have and "prompt" in have:
        col["question"] = "prompt"
    return col


def task_row(row: dict, task_id: str, question, answer: str | None) -> dict:
    """A task: the source row's own columns, then task_id, question and (when the source has one) answer."""
    task = {**{k: v for k, v in row.items() if k not in TASK_FIELDS}, "task_id": task_id, "question": question}
    if answer is not None:
        task["answer"] = answer
    return task


CHAT_ROLES = ("system", "user", "assistant", "tool")


def question_value(value: object, *, chat: bool) -> tuple[str | list[dict] | None, str | None]:
    """(question, None) or (None, problem): text, stripped, or (with `chat`) a conversational prompt as TRL's
    datasets hold it, a list of {"role", "content"} messages (kept as they are: the chat template renders
    them, system turn included)."""
    if isinstance(value, str):
        return (value.strip(), None) if value.strip() else (None, "is empty")
    if isinstance(value, (list, tuple)) and not chat:
        return None, ("holds chat messages (a conversational prompt); only --env single, where --reward functions "
                      "score the episodes, takes those")
    if not isinstance(value, (list, tuple)):
        return None, (f"must be {'text or a list of chat messages' if chat else 'a string'}, got "
                      f"{'null' if value is None else type(value).__name__}")
    if not value:
        return None, "is an empty list of chat messages"
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES or not isinstance(m.get("content"), str):
            return None, (f"message {i} is not {{'role': {'/'.join(CHAT_ROLES)}, 'content': text}} "
                          f"(got {str(m)[:60]})")
    return [{"role": m["role"], "content": m["content"]} for m in value], None


def parse_task_fields(text: str | None, keys: tuple[str, ...] = TASK_FIELDS) -> dict[str, str]:
    """{"question": column, ...} from "question=problem,answer=solution,task_id=id" (None or '': {}); `keys`:
    the keys a program maps (an SFT source's are its own)."""
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, sep, column = (s.strip() for s in part.partition("="))
        if not sep or not key or not column:
            raise TaskFieldsError(f"{part.strip()!r} is not key=column (keys: {', '.join(keys)})")
        if key not in keys:
            raise TaskFieldsError(f"unknown key {key!r} in {part.strip()!r} (keys: {', '.join(keys)})")
        if key in out:
            raise TaskFieldsError(f"key {key!r} is given twice")
        out[key] = column
    return out
