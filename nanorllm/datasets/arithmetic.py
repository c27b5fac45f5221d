"""Synthetic arithmetic tasks: a cheap, exactly gradable curriculum for smoke runs and warm-up.

A problem is `terms` operands of exactly `digits` digits (or, with `max_operand`, any integer from
0 to max_operand) joined by operators from `ops`, asked as
"What is 7 + 3 * 5?". The answer is computed with integer arithmetic under the usual precedence
(`*` before `+`/`-`, left to right otherwise), never with `eval`.

Generation is deterministic in the seed. A small problem space is enumerated and shuffled so the
first `count` tasks never repeat until the space is exhausted; a large one is sampled uniformly.
A spec string such as "arith:digits=2,terms=3,ops=+-,count=500,seed=3" selects a generator from
the command line (see `parse_arith_spec`).
"""

import random

ALLOWED_OPS = "+-*"
ENUMERATE_LIMIT = 2_000_000
SPEC_DEFAULTS: dict = {"digits": 1, "terms": 2, "ops": "+", "count": 1000, "seed": 0, "max_operand": None}
SPEC_KEYS = {"digits": "digits", "terms": "terms", "ops": "ops", "count": "count", "seed": "seed",
             "max": "max_operand"}  # spec key -> keyword argument


def _unique_ops(ops: str) -> str:
    """Operators in first-seen order without repeats, so "++-" weighs `+` and `-` equally."""
    return "".join(dict.fromkeys(ops))


def _check_params(digits: int, terms: int, ops: str) -> str:
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    if terms < 1:
        raise ValueError(f"terms must be >= 1, got {terms}")
    if not ops or any(op not in ALLOWED_OPS for op in ops):
        raise ValueError(f"ops must be a non-empty string of {ALLOWED_OPS!r}, got {ops!r}")
    return _unique_ops(ops)


def _operand_range(digits: int, max_operand: int | None = None) -> tuple[int, int]:
    """Smallest and largest operand: 0..max_operand if given, else exactly `digits` digits
    (one digit includes 0)."""
    if max_operand is not None:
        if max_operand < 1:
            raise ValueError(f"max_operand must be >= 1, got {max_operand}")
        return 0, max_operand
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return low, 10**digits - 1


def arithmetic_space_size(digits: int, terms: int, ops: str, max_operand: int | None = None) -> int:
    """Number of distinct problems: operand tuples times operator tuples."""
    ops = _check_params(digits, terms, ops)
    low, high = _operand_range(digits, max_operand)
    return (high - low + 1) ** terms * len(ops) ** (terms - 1)


def _evaluate(operands: list[int], operators: list[str]) -> int:
    """operands[0] operators[0] operands[1] ... evaluated with `*` before `+` and `-`."""
    if len(operators) != len(operands) - 1:
        raise ValueError("need exactly one operator between each pair of operands")
    total = 0
    sign = 1
    product = operands[0]
    for op, value in zip(operators, operands[1:]):
        if op == "*":
            product *= value
        elif op in "+-":
            total += sign * product
            sign = 1 if op == "+" else -1
            product = value
        else:
            raise ValueError(f"unknown operator {op!r}")
    return total + sign * product


def _decode(
    index: int, low: int, n_values: int, terms: int, ops: str
) -> tuple[list[int], list[str]]:
    """The problem at position `index` of the enumerated space (mixed-radix digits)."""
    operands = []
    for _ in range(terms):
        index, r = divmod(index, n_values)
        operands.append(low + r)
    operators = []
    for _ in range(terms - 1):
        index, r = divmod(index, len(ops))
        operators.append(ops[r])
    return operands, operators


def _make_task(task_id: str, operands: list[int], operators: list[str]) -> dict:
    parts = [str(operands[0])]
    for op, value in zip(operators, operands[1:]):
        parts += [op, str(value)]
    return {
        "task_id": task_id,
        "question": f"What is {' '.join(parts)}?",
        "answer": str(_evaluate(operands, operators)),
    }


def make_arithmetic_tasks(
    *,
    digits: int = 1,
    terms: int = 2,
    ops: str = "+",
    count: int = 1000,
    seed: int = 0,
    prefix: str = "arith",
    max_operand: int | None = None,
) -> list[dict]:
    """`count` arithmetic tasks, identical for identical arguments.

    Spaces of at most 2,000,000 problems are shuffled with `random.Random(seed)` and read in
    order, reshuffled each time they run out, so a repeat appears only after every problem has
    been used. Larger spaces are sampled uniformly with the same seeded generator.
    Task ids are f"{prefix}-s{seed}-{i:06d}" with i counting from 0.
    """
    ops = _check_params(digits, terms, ops)
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    rng = random.Random(seed)
    low, high = _operand_range(digits, max_operand)
    n_values = high - low + 1
    size = arithmetic_space_size(digits, terms, ops, max_operand)
    problems: list[tuple[list[int], list[str]]] = []
    if size <= ENUMERATE_LIMIT:
        order = list(range(size))
        while len(problems) < count:
            rng.shuffle(order)
            for index in order[: count - len(problems)]:
                problems.append(_decode(index, low, n_values, terms, ops))
    else:
        for _ in range(count):
            operands = [rng.randint(low, high) for _ in range(terms)]
            operators = [rng.choice(ops) for _ in range(terms - 1)]
            problems.append((operands, operators))
    return [
        _make_task(f"{prefix}-s{seed}-{i:06d}", operands, operators)
        for i, (operands, operators) in enumerate(problems)
    ]


def _parse_int(key: str, value: str, spec: str) -> int:
    text = value.strip()
    digits = text[1:] if text[:1] in "+-" else text
    if not digits.isascii() or not digits.isdigit():
        raise ValueError(f"arith spec {spec!r}: key {key!r} needs an integer, got {value!r}")
    return int(text)


def parse_arith_spec(spec: str) -> dict:
    """Keyword arguments for `make_arithmetic_tasks` from "arith:key=value,...".

    Keys are digits, terms, ops, count, seed and max (operands 0..max instead of `digits`
    digits), each optional (defaults as in
    `make_arithmetic_tasks`); "arith" and "arith:" alone give all defaults. Anything else
    (unknown or repeated keys, non-integers, digits/terms/count < 1, ops outside "+-*")
    raises ValueError naming the key and the spec.
    """
    if spec == "arith":
        body = ""
    elif spec.startswith("arith:"):
        body = spec[len("arith:") :]
    else:
        raise ValueError(f"arith spec {spec!r}: must be 'arith' or start with 'arith:'")
    params = dict(SPEC_DEFAULTS)
    seen: set[str] = set()
    for item in body.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"arith spec {spec!r}: item {item!r} is not key=value")
        if key not in SPEC_KEYS:
            known = ", ".join(SPEC_KEYS)
            raise ValueError(f"arith spec {spec!r}: unknown key {key!r} (known: {known})")
        if key in seen:
            raise ValueError(f"arith spec {spec!r}: key {key!r} is given twice")
        seen.add(key)
        if key == "ops":
            ops = value.strip()
            if not ops or any(op not in ALLOWED_OPS for op in ops):
                raise ValueError(
                    f"arith spec {spec!r}: key 'ops' must be a non-empty mix of "
                    f"{ALLOWED_OPS!r}, got {value!r}"
                )
            params["ops"] = ops
            continue
        number = _parse_int(key, value, spec)
        if key != "seed" and number < 1:
            raise ValueError(f"arith spec {spec!r}: key {key!r} must be >= 1, got {number}")
        params[SPEC_KEYS[key]] = number
    return params
