"""What a judge is asked and how its reply is read: the rubric file, the request text, the score format.

A rubric is free text (markdown is fine) that says what a good response is. Its score range comes first,
either as a first line `score: LOW-HIGH` or in a front-matter block (`---` lines around `score: LOW-HIGH`);
without one the range is 0-10. The judge sees the rubric, then the prompt and the response(s).

Each request carries a nonce, drawn fresh for it (new_nonce), that the judge must echo with its verdict:
- one response (`--judge-mode single`): the reply ends with a line `SCORE[<nonce>]: <number>` within the
  rubric's range; the last line with this request's nonce counts, and the score is normalised to [0, 1] by the
  range. The number is plain (`7`, `7.5`, `**7**`, `7/10` on a 0-10 rubric): `1e5`, `7.5.3` or `7 (good)` is
  no score, so a reply is read as it was meant or not at all.
- a group (`--judge-mode group`, RULER's shape): the responses of one prompt, numbered from 1, in one
  request; the reply holds a JSON object `{"nonce": "<nonce>", "scores": [s1, s2, ...]}`, one score in [0, 1]
  per response, in order. All or none: a missing, extra, non-numeric or out-of-range score fails the whole group.

Why a nonce: a response is the policy's text, and a judge may quote it. The policy never sees the nonce (it is
drawn after the response is written), so nothing it wrote can set the verdict (a quoted `SCORE: 10`, a guessed
`SCORE[...]: 10`, is not read) or void it: passing over the score lines that also stand in a response, the
obvious filter, let a response holding `SCORE: 0` ... `SCORE: 10` turn its low score into a failed one.

A reply that cannot be read raises ScoreError; the judge turns it into a failed score (NaN).
"""

import json
import math
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

DEFAULT_RANGE = (0.0, 10.0)
_RANGE = re.compile(r"^\s*score\s*:\s*(-?\d+(?:\.\d+)?)\s*(?:-|\.\.|to)\s*(-?\d+(?:\.\d+)?)\s*$", re.I)
_SCORE = re.compile(r"^\W*score\s*\[([^\]\n]*)\]\W*?[:=](.*)$", re.I | re.M)  # 1: the nonce; 2: after the colon
_SCORES = re.compile(r"\{[^{}]*\"scores\"[^{}]*\}")  # a scores object (no nesting)
NONCE_BYTES = 8
_PLAIN = re.compile(r"\s*\**\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?))?\s*\**\s*\.?\s*")  # 7, **7.5**, 7/10


class RubricError(ValueError):
    """A rubric file that cannot be used: the message names the file."""


class ScoreError(ValueError):
    """A judge's reply that holds no usable score."""


@dataclass(frozen=True)
class Rubric:
    text: str  # what the judge is told, the score line or front matter taken out
    low: float = DEFAULT_RANGE[0]
    high: float = DEFAULT_RANGE[1]


def parse_rubric(source: str, where: str = "rubric") -> Rubric:
    """A Rubric from a rubric file's text; RubricError naming `where` when its range is unreadable or empty."""
    lines = source.splitlines()
    head, rest = None, lines
    if lines and lines[0].strip() == "---":
        end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
        if end is None:
            raise RubricError(f"{where}: the front matter opened by '---' on line 1 is never closed")
        head = [l for l in lines[1:end] if l.strip().lower().startswith("score")]
        if not head:
            raise RubricError(f"{where}: the front matter has no 'score: LOW-HIGH' line")
        head, rest = head[0], lines[end + 1:]
    elif lines and lines[0].strip().lower().startswith("score"):
        head, rest = lines[0], lines[1:]
    low, high = DEFAULT_RANGE
    if head is not None:
        m = _RANGE.match(head)
        if not m:
            raise RubricError(f"{where}: {head.strip()!r} is not 'score: LOW-HIGH' (e.g. 'score: 0-10')")
        low, high = float(m.group(1)), float(m.group(2))
        if not low < high:
            raise RubricError(f"{where}: the score range {low:g}-{high:g} is empty (LOW must be below HIGH)")
    text = "\n".join(rest).strip()
    if not text:
        raise RubricError(f"{where}: no rubric text (say what a good response is)")
    return Rubric(text=text, low=low, high=high)


def load_rubric(path: str) -> Rubric:
    try:
        source = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise RubricError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None
    return parse_rubric(source, path)


def new_nonce() -> str:
    """A fresh nonce for one request: 16 hex digits no response can have seen."""
    return secrets.token_hex(NONCE_BYTES)


def single_messages(rubric: Rubric, prompt: str, response: str, nonce: str) -> list[dict]:
    """The chat messages of a one-response request."""
    system = (f"You are a strict grader. Grade the response against this rubric.\n\n{rubric.text}\n\n"
              f"Give a score from {rubric.low:g} to {rubric.high:g}. End your reply with one line, the code in "
              f"brackets copied exactly: SCORE[{nonce}]: <number>")
    return [{"role": "system", "content": system},
            {"role": "user", "content": f"## Prompt\n{prompt}\n\n## Response\n{response}"}]


def group_messages(rubric: Rubric, prompt: str, responses: list[str], nonce: str) -> list[dict]:
    """The chat messages of a group request: the responses to one prompt, numbered from 1."""
    system = (f"You are a strict grader. Grade each response against this rubric, comparing them with each "
              f"other.\n\n{rubric.text}\n\nReply with one JSON object, the code copied exactly and a score "
              f'from 0 to 1 for each response, in order: {{"nonce": "{nonce}", "scores": [s1, s2, ...]}} '
              f"({len(responses)} scores)")
    listed = "\n\n".join(f"## Response {i}\n{r}" for i, r in enumerate(responses, 1))
    return [{"role": "system", "content": system}, {"role": "user", "content": f"## Prompt\n{prompt}\n\n{listed}"}]


def parse_score(reply: str, rubric: Rubric, nonce: str) -> float:
    """The last `SCORE[<nonce>]: <number>` line of `reply` with this request's nonce, normalised to [0, 1] by the
    rubric's range; ScoreError when there is none or its value is not a plain number in range."""
    found = [m for m in _SCORE.finditer(reply or "") if m.group(1).strip(" <>").lower() == nonce]
    if not found:
        raise ScoreError(f"no 'SCORE[{nonce}]: <number>' line with the request's nonce in the reply: {clip(reply)}")
    value = _PLAIN.fullmatch(found[-1].group(2))
    if value is None:
        raise ScoreError(f"the score line {clip(found[-1].group(0))} does not hold a plain number")
    score, out_of = float(value.group(1)), value.group(2)
    if out_of is not None and float(out_of) != rubric.high:
        raise ScoreError(f"score {value.group(1)}/{out_of} is not on the rubric's scale {rubric.low:g}-{rubric.high:g}")
    if not rubric.low <= score <= rubric.high:
        raise ScoreError(f"score {score:g} is outside the rubric's range {rubric.low:g}-{rubric.high:g}")
    return (score - rubric.low) / (rubric.high - rubric.low)


def parse_group_scores(reply: str, n: int, nonce: str) -> list[float]:
    """The last `{"nonce": ..., "scores": [...]}` object of `reply` holding this request's nonce (code fences
    allowed): exactly `n` numbers in [0, 1]."""
    objects = [o for o in _SCORES.findall(reply or "") if nonce in o]
    if not objects:
        raise ScoreError(f'no {{"nonce": "{nonce}", "scores": [...]}} object in the reply: {clip(reply)}')
    try:
        scores = json.loads(objects[-1])["scores"]
    except (ValueError, KeyError) as e:
        raise ScoreError(f"the scores object is not JSON: {clip(objects[-1])} ({e})") from None
    if not isinstance(scores, list) or len(scores) != n:
        got = f"{len(scores)} scores" if isinstance(scores, list) else repr(scores)
        raise ScoreError(f"{got} for a group of {n} responses")
    bad = [s for s in scores if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s)
           or not 0 <= s <= 1]
    if bad:
        raise ScoreError(f"scores must be numbers in [0, 1], got {bad[0]!r}")
    return [float(s) for s in scores]


def clip(text: str | None, n: int = 120) -> str:
    """`text` on one line, cut at `n` characters, quoted: for a message."""
    text = (text or "").strip().replace("\n", " ")
    return repr(text if len(text) <= n else text[:n] + "...")
