"""Answer checking: find the last \\boxed{...} in a response and compare it to the gold answer. Never `eval`.

Two paths, chosen by the gold answer:
- **Numeric gold** (an integer, decimal or fraction, e.g. GSM8K's "1,000"): the box must hold *a plain
  number*, and it is compared exactly as a rational (`fractions.Fraction`). No sympy, so no time limit
  and no way for machine load to change a verdict. A general equivalence checker would evaluate
  `\\boxed{4 - 17}` to -13 and `\\boxed{8 = 7}` to its right-hand side: a policy could earn full reward
  by restating the question. Accepted forms (see `parse_number`):
    integer `7`, decimal `7.0` / `.5`, sign `-7` / `+7` / `−7` (U+2212), thousands separators `1,000`
    (groups of exactly three) and `1{,}000`, fractions `\\frac{1}{2}` / `\\dfrac` / `\\tfrac` / `1/2`
    in lowest terms with a denominator > 1, surrounding `$` / `\\(...\\)` / spaces / `\\!`, a leading
    `\\$` (currency), one trailing unit: `\\text{...}` / `\\mathrm{...}` without digits, a single word,
    `\\%` or `^\\circ`.
  Anything else scores 0: expressions (`3+4`, `0.7 \\times 10`), equations (`x = 7`), several values
  (`7, 7`), unreduced fractions (`14/2`), scientific notation, words with numbers.
- **Any other gold** (`\\sqrt{2}`, `x + 1`, an interval): math-verify equivalence (LaTeX -> sympy),
  in a helper process killed at a hard *CPU-time* budget (envs/symbolic.py): no library can swallow
  that limit, and a contended machine slows the clock, not the budget. Every timeout is reported
  (`Verdict.timed_out`, counted as `reward/grader_timeouts`).

Gold numbers may be longer than Python's int-string limit (4,300 digits): they are converted in
chunks, so a 5,001-digit gold is compared exactly like a short one.

We extract the box ourselves (brace matching, last box wins) so the rule is exact and testable.
Over-long answers are rejected before parsing: a 10,000-character "answer" is not an answer.
"""

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

from nanorllm.core.limits import GRADER_TIMEOUT_S
from nanorllm.datasets.golds import extract_boxed  # noqa: F401  (the grader's box is the task readers' box)
from nanorllm.envs.symbolic import CHECKER

MAX_ANSWER_CHARS = 200
_INT_CHUNK = 4000  # digits per int() call: under Python's int-string limit


@dataclass
class Verdict:
    correct: bool
    extracted: str | None  # the box content; None when there is no closed box
    timed_out: bool = False  # the symbolic check ran out of CPU time (counted, scored 0)


# ---- numbers ----------------------------------------------------------------------------------
_INT = r"(?:\d{1,3}(?:,\d{3})+|\d+)"  # thousands groups of exactly three, or plain digits
_DECIMAL = re.compile(rf"({_INT})?(?:\.(\d*))?")
_FRAC = re.compile(r"\\[dt]?frac\{(\d+)\}\{(\d+)\}|(\d+)/(\d+)")
# One unit after the number: \text{ cm} (no digits inside), a word after a space, a percent sign, degrees.
_UNIT_SUFFIX = re.compile(r"(?<=[\d}.])(?:\s*\\(?:text|mathrm|textrm|mbox)\{[^{}\d]*\}|\s+[A-Za-z]+|\s*\\?%"
                          r"|\s*\^\{?\\circ\}?)$")
_WRAPPERS = [("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")]


def _strip_decorations(s: str) -> str:
    s = s.strip()
    for left, right in _WRAPPERS:
        if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
            s = s[len(left):len(s) - len(right)].strip()
    s = s.replace("\\!", "").replace("{,}", ",").replace("\u2212", "-")
    s = re.sub(r"\\[,;: ]|~", " ", s).strip()
    whole_text = re.fullmatch(r"\\(?:text|mathrm|textrm|mbox)\{([^{}]*)\}", s)
    if whole_text:  # \text{7}
        s = whole_text.group(1).strip()
    s = _UNIT_SUFFIX.sub("", s).strip()
    if s.startswith("\\$"):  # currency
        s = s[2:].lstrip()
    return s


def parse_number(text: str, *, lowest_terms: bool = True) -> Fraction | None:
    """The exact value of a plain number written as a final answer, or None if it is anything else.

    `lowest_terms=False` is for gold answers, which are data, not something the policy wrote.
    """
    s = _strip_decorations(text)
    sign = 1
    if s and s[0] in "+-":
        sign, s = (-1 if s[0] == "-" else 1), s[1:].lstrip()
    frac = _FRAC.fullmatch(s)
    if frac:
        num, den = (_int(g) for g in (frac.group(1, 2) if frac.group(1) else frac.group(3, 4)))
        if den == 0 or (lowest_terms and (den == 1 or math.gcd(num, den) != 1)):
            return None
        return sign * Fraction(num, den)
    dec = _DECIMAL.fullmatch(s)
    if not dec or not (dec.group(1) or dec.group(2)):
        return None
    whole, part = (dec.group(1) or "0").replace(",", ""), dec.group(2) or ""
    return sign * Fraction(_int(whole + part), 10 ** len(part))


def _int(digits: str) -> int:
    """int() of a digit string of any length (Python refuses more than 4,300 digits at once)."""
    if len(digits) <= _INT_CHUNK:
        return int(digits)
    value = 0
    for i in range(0, len(digits), _INT_CHUNK):
        chunk = digits[i:i + _INT_CHUNK]
        value = value * 10 ** len(chunk) + int(chunk)
    return value


def check_answer(predicted: str, gold: str, *, cpu_limit_s: float = GRADER_TIMEOUT_S,
                 progress: Callable[[], None] | None = None) -> tuple[bool, bool]:
    """(correct, timed out) for one extracted answer against the gold answer; returns within the CPU
    budget (plus the helper's start, once per process) whatever the gold. `progress()` is called
    while a symbolic check runs (a worker beats its heartbeat with it)."""
    predicted, gold = predicted.strip(), gold.strip()
    if not predicted or len(predicted) > MAX_ANSWER_CHARS:
        return False, False
    gold_value = parse_number(gold, lowest_terms=False)
    if gold_value is not None:
        return parse_number(predicted) == gold_value, False
    if predicted == gold:
        return True, False
    return CHECKER.check(predicted, gold, cpu_limit_s, progress)


def judge(response: str, gold: str, *, cpu_limit_s: float = GRADER_TIMEOUT_S,
          progress: Callable[[], None] | None = None) -> Verdict:
    """Grade a whole response. A response without a closed \\boxed{} is wrong."""
    boxed = extract_boxed(response)
    if boxed is None:
        return Verdict(False, None)
    correct, timed_out = check_answer(boxed, gold, cpu_limit_s=cpu_limit_s, progress=progress)
    return Verdict(correct, boxed, timed_out)


def grade(response: str, gold: str, *, cpu_limit_s: float = GRADER_TIMEOUT_S) -> tuple[bool, str | None]:
    """(correct, extracted answer)."""
    v = judge(response, gold, cpu_limit_s=cpu_limit_s)
    return v.correct, v.extracted
