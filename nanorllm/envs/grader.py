"""Answer checking: find the last \\boxed{...} in a response and compare it to the gold answer by
math equivalence (math-verify, which parses LaTeX into sympy), under a time limit. Never `eval`.

We extract the box ourselves (brace matching, last box wins) so the rule is exact and testable, and
hand only the box content to math-verify. Over-long answers are rejected before parsing: a
10,000-character "answer" is not an answer and must not cost the rollout seconds of sympy.
"""

import re
import threading

from math_verify import parse, verify
from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig

MAX_ANSWER_CHARS = 200
_EXTRACTION = [LatexExtractionConfig(), ExprExtractionConfig()]


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


_THOUSANDS = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d+)?")


def _parse(answer: str, timeout_s: int | None):
    # "1,000" is a thousands separator in a final answer; "1,2" is not a number twelve.
    cleaned = answer.replace(",", "") if _THOUSANDS.fullmatch(answer) else answer
    return parse(f"${cleaned}$", extraction_config=_EXTRACTION, parsing_timeout=timeout_s)


def is_equivalent(predicted: str, gold: str, *, timeout_s: int = 2) -> bool:
    """True when two answer strings are mathematically equal (e.g. '0.5' and '\\frac{1}{2}')."""
    predicted, gold = predicted.strip(), gold.strip()
    if not predicted or len(predicted) > MAX_ANSWER_CHARS:
        return False
    if predicted == gold:
        return True
    # math-verify's time limit uses SIGALRM, which only the main thread may set.
    limit = timeout_s if threading.current_thread() is threading.main_thread() else None
    try:
        gold_parsed, pred_parsed = _parse(gold, limit), _parse(predicted, limit)
        if not gold_parsed or not pred_parsed:
            return False
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=limit))
    except Exception:  # a parser or timeout failure means "not shown to be equal"
        return False


def grade(response: str, gold: str, *, timeout_s: int = 2) -> tuple[bool, str | None]:
    """(correct, extracted answer). A response without a closed \\boxed{} is wrong."""
    boxed = extract_boxed(response)
    if boxed is None:
        return False, None
    return is_equivalent(boxed, gold, timeout_s=timeout_s), boxed
