"""Seeds as tasks, for the ecosystems whose environments have no task file (TextArena's games, OpenEnv's
servers): `PREFIX:count=N,seed=S` is the seeds S .. S+N-1, one task each. Training and held-out sets come from
ranges that never meet (`TRAIN_SEEDS`, `EVAL_SEEDS`), so no held-out episode is ever trained on.
"""

TRAIN_SEEDS, EVAL_SEEDS = (0, 2000), (1_000_000, 200)  # (first seed, count): the ranges never meet


def seed_spec(prefix: str, seeds: tuple[int, int]) -> str:
    """The spec of `seeds` (first seed, count): `PREFIX:count=N,seed=S`."""
    return f"{prefix}:count={seeds[1]},seed={seeds[0]}"


def parse_seed_spec(spec: str, default: tuple[int, int] = TRAIN_SEEDS) -> tuple[int, int]:
    """(first seed, count) of `PREFIX:count=N,seed=S`; a key left out takes `default`'s (first seed, count)."""
    prefix, _, body = spec.partition(":")
    params = {"count": default[1], "seed": default[0]}
    for item in filter(None, (p.strip() for p in body.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in params:
            raise ValueError(f"{prefix} spec {spec!r}: {item!r} is not count=N or seed=S")
        try:
            params[key] = int(value)
        except ValueError:
            raise ValueError(f"{prefix} spec {spec!r}: {key} must be an integer, got {value!r}") from None
    if params["count"] < 1 or params["seed"] < 0:
        raise ValueError(f"{prefix} spec {spec!r}: count must be >= 1 and seed >= 0")
    return params["seed"], params["count"]
