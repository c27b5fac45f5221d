"""A held-out share of a task set: `holdout:frac=F,seed=S:SPEC` is the tasks of SPEC whose task_id, hashed with
the seed S, falls in the first fraction F of the hash space.

Why a share of the user's own tasks: a run given `--tasks` but no `--eval-tasks` used to be evaluated on its env's
built-in set (for `--env single` with `--reward`, 200 arithmetic sums that had nothing to do with the user's data).
Its held-out set is now `holdout:frac=0.1,seed=0:TASKS` (`default_holdout`), written to config.json as such, so
launch/eval.py evaluates a run's model on the same tasks; training removes them (datasets/tasks.py remove_overlap).

The choice depends on a task's id alone, never on the order, the size read or the other tasks, so a task set that
grows keeps its held-out tasks. A set too small for any id to fall in the share holds out its one lowest hash.
"""

import hashlib

PREFIX = "holdout:"
FRACTION, SEED = 0.1, 0  # the share of a user's own --tasks held out when no --eval-tasks is given
FORM = "holdout:frac=F,seed=S:SPEC"


def default_holdout(tasks: str) -> str:
    """The held-out spec of a run that gives `tasks` and no --eval-tasks."""
    return f"{PREFIX}frac={FRACTION:g},seed={SEED}:{tasks}"


def is_holdout(spec: str) -> bool:
    return spec.startswith(PREFIX)


def parse_holdout(spec: str) -> tuple[float, int, str]:
    """(fraction, seed, the inner task spec) of `holdout:frac=F,seed=S:SPEC`; ValueError naming the form."""
    params, sep, inner = spec[len(PREFIX):].partition(":")
    values = {"frac": FRACTION, "seed": SEED}
    try:
        for item in filter(None, (p.strip() for p in params.split(","))):
            key, eq, value = item.partition("=")
            if not eq or key not in values:
                raise ValueError(item)
            values[key] = float(value) if key == "frac" else int(value)
    except ValueError:
        raise ValueError(f"{spec!r}: expected {FORM}") from None
    if not sep or not inner or not 0 < values["frac"] < 1:
        raise ValueError(f"{spec!r}: expected {FORM}, F between 0 and 1 and SPEC a task spec")
    return values["frac"], values["seed"], inner


def _position(task_id: str, seed: int) -> float:
    """Where a task's id falls in [0, 1) of the hash space of `seed`."""
    return int(hashlib.sha1(f"{seed}:{task_id}".encode()).hexdigest()[:15], 16) / 16 ** 15


def held_out(rows: list[dict], fraction: float, seed: int) -> list[dict]:
    """The rows whose task_id falls in the first `fraction` of the hash space (module docstring), in their order."""
    if not rows:
        return []
    chosen = [r for r in rows if _position(r["task_id"], seed) < fraction]
    return chosen or [min(rows, key=lambda r: _position(r["task_id"], seed))]
