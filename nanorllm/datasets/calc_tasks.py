"""Multi-step arithmetic where a calculator helps: two-digit operands, at least one product.

"What is 37 * 52 - 64 + 18?": 3 to 4 operands from 10 to 99, joined by + - *, at least one `*`
(a product of two two-digit numbers is beyond a small model's mental arithmetic; with the tool it is
one call). Answers by integer arithmetic (`arithmetic._evaluate`), never `eval`. Deterministic in the
seed; the space (~10^9 problems) is sampled, so a training and a held-out set from different seeds
rarely meet, and `remove_overlap` drops any question they share. Spec: "calc:count=2000,seed=1,terms=3,max_terms=4".
"""

import random

from nanorllm.datasets.arithmetic import _make_task

CALC_DEFAULTS = {"count": 1000, "seed": 0, "terms": 3, "max_terms": 4}


def make_calc_tasks(*, count: int = 1000, seed: int = 0, terms: int = 3, max_terms: int = 4,
                    prefix: str = "calc") -> list[dict]:
    if not 2 <= terms <= max_terms:
        raise ValueError(f"need 2 <= terms <= max_terms, got terms={terms}, max_terms={max_terms}")
    rng = random.Random(seed)
    tasks = []
    for i in range(count):
        n = rng.randint(terms, max_terms)
        operands = [rng.randint(10, 99) for _ in range(n)]
        operators = [rng.choice("+-*") for _ in range(n - 1)]
        operators[rng.randrange(n - 1)] = "*"
        tasks.append(_make_task(f"{prefix}-s{seed}-{i:06d}", operands, operators))
    return tasks


def parse_calc_spec(spec: str) -> dict:
    """Keyword arguments for `make_calc_tasks` from "calc" or "calc:key=value,..."; ValueError names the key."""
    if spec != "calc" and not spec.startswith("calc:"):
        raise ValueError(f"calc spec {spec!r}: must be 'calc' or start with 'calc:'")
    params = dict(CALC_DEFAULTS)
    for item in filter(str.strip, spec[5:].split(",")):
        key, sep, value = (x.strip() for x in item.partition("="))
        if not sep or key not in CALC_DEFAULTS:
            raise ValueError(f"calc spec {spec!r}: bad item {item!r} (keys: {', '.join(CALC_DEFAULTS)})")
        try:
            params[key] = int(value)
        except ValueError:
            raise ValueError(f"calc spec {spec!r}: key {key!r} needs an integer, got {value!r}") from None
    if params["count"] < 1:
        raise ValueError(f"calc spec {spec!r}: count must be >= 1")
    return params
