"""Advantage estimators: an episode's reward against a baseline from its group, each behind a name.

`ESTIMATORS` maps a name to its function and `TrainConfig.adv_estimator` takes its names, so a new
estimator is one function, one `@register_estimator("name")` and one test (verl's `register_adv_est`,
verl/trainer/ppo/core_algos.py, is the model). User code needs no change here: `--adv-estimator` also takes
`path/to/file.py:fn` or `module.path:fn` (the forms --reward takes), imported and registered under that spec
by `estimator_named` in whichever process computes advantages, and a name registered from Python before the
config is checked is a choice like the built-in ones.

An estimator sees comparison sets: by default (turn_credit="episode") one per group, each item an
episode's reward and all its turns' samples, so in a wrong -> right episode the wrong first answer is
rewarded like a first-try success. turn_credit="turn" scores each turn by its return, its own reward
(the env's per-turn reward: 1 for the correct answer) plus gamma x the next turn's return, and compares
the group's turns with the same index (all first turns together, all second turns together). It returns
one advantage per item, exactly 0 for every item of a constant set, never NaN.
`reward_of` overrides the reward an episode is scored by (DAPO's overlong shaping, `overlong_penalty`).
"rae" is SPIRAL's role-conditioned advantage for games (rollout/games.py): r - b, b a running mean of the
rewards of one game and seat, kept across steps (`role_baselines`, saved in checkpoints) instead of a group's mean.

Whether a group carries a signal at all is one test, `carries_signal`, on the env's rewards: fill-batch
counts the mixed groups with it, the update zeroes and drops the others, and `frac_reward_zero_std`
counts them. Shaping a reward does not make a group mixed: DAPO keeps a group when 0 < correct < G, so
an all-correct group with one answer in the overlong buffer is dropped, not trained with its correct
answers set against each other.
"""

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

from nanorllm.core.types import RolloutResult, StepSample

ComparisonSet = list[tuple[float, list[StepSample]]]  # (reward, the samples that get its advantage) per item


@dataclass(frozen=True)
class AdvantageSpec:
    """What an estimator may read besides the rewards (compute_advantage's keyword arguments)."""

    normalize_std: bool = True  # grpo: divide by the group std
    eps: float = 1e-6  # added to a std before dividing by it
    std: str = "population"  # a std's variance over n values: / n ("population") or / (n - 1) ("unbiased")
    turn_credit: str = "episode"
    batch_stats: Callable[[dict[str, float]], dict[str, float]] | None = None  # sums over learner ranks
    roles: tuple[str, ...] = ()  # rae: the role (RolloutResult.role) of each comparison set, in order
    role_baselines: dict[str, float] | None = None  # rae: each role's baseline, updated in place (None: fresh)
    rae_decay: float = 0.95  # rae: b <- decay x b + (1 - decay) x the step's mean reward of the role


Estimator = Callable[[list[ComparisonSet], AdvantageSpec], list[list[float]]]
ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(name: str) -> Callable[[Estimator], Estimator]:
    """`@register_estimator("name")` on fn(sets, spec) -> one advantage per item of each set."""
    def add(fn: Estimator) -> Estimator:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is registered already ({ESTIMATORS[name].__name__})")
        ESTIMATORS[name] = fn
        return fn
    return add


USER_ESTIMATOR = "path/to/file.py:fn or module.path:fn"
"""The forms a user's estimator is named in (the forms of --reward's functions, nanorllm/utils/modules.py)."""


def estimator_problem(name: str) -> str | None:
    """Why `name` names no estimator on its own terms (None: a registered name, or a user spec whose import the
    run checks): the registered names listed."""
    if name in ESTIMATORS or ":" in name:
        return None
    return f"must be one of {', '.join(ESTIMATORS)}, got {name!r} (or a user estimator, {USER_ESTIMATOR})"


def estimator_named(name: str) -> Estimator:
    """The estimator `name` names: a registered one, or a user's `where:fn` spec, imported (once per process) and
    registered under the spec itself, so a config keeps the string and a resume imports it again. EnvSpecError (a
    ValueError) naming the spec when it does not import or names no function; ValueError for an unknown name."""
    if name in ESTIMATORS:
        return ESTIMATORS[name]
    problem = estimator_problem(name)
    if problem:
        raise ValueError(f"estimator {problem}")
    from nanorllm.utils.modules import EnvSpecError, import_spec

    module, where, fn_name = import_spec(name, USER_ESTIMATOR)
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise EnvSpecError(f"{name!r}: {where} has no function {fn_name!r}")
    return ESTIMATORS.setdefault(name, fn)


def carries_signal(results: list[RolloutResult], *, turn_credit: str = "episode", turn_gamma: float = 1.0) -> bool:
    """Whether a group can teach anything: its episodes' env rewards are not all the same (turn credit: the
    returns of some turn index are not). Decided on the env's reward, never a shaped one; call it on the
    episodes that train (after drop_failed)."""
    if turn_credit == "episode":
        return len({r.reward for r in results}) > 1
    by_turn: dict[int, set[float]] = defaultdict(set)
    for r in results:
        for s, ret in zip(r.step_samples, turn_returns(r, turn_gamma)):
            by_turn[s.turn].add(ret)
    return any(len(returns) > 1 for returns in by_turn.values())


def silent_groups(groups: dict[str, list[RolloutResult]], *, turn_credit: str = "episode",
                  turn_gamma: float = 1.0) -> set[str]:
    """The ids of the groups that carry no signal (`carries_signal`)."""
    return {g for g, rs in groups.items() if not carries_signal(rs, turn_credit=turn_credit, turn_gamma=turn_gamma)}


def compute_advantage(groups: dict[str, list[RolloutResult]], *, normalize_std: bool = True,
                      eps: float = 1e-6, turn_credit: str = "episode", turn_gamma: float = 1.0,
                      estimator: str = "grpo", reward_of: Callable[[RolloutResult], float] | None = None,
                      batch_stats: Callable[[dict[str, float]], dict[str, float]] | None = None,
                      silent: set[str] | None = None, std: str = "population",
                      role_baselines: dict[str, float] | None = None,
                      rae_decay: float = 0.95) -> dict[str, list[RolloutResult]]:
    """Write the estimator's advantage (grpo: (r - mean) [/ (std + eps)]) into every StepSample of every
    episode; returns `groups`.

    A group without signal (`silent`, the caller's silent_groups; default: computed here) gets advantage
    exactly 0, never NaN, whatever eps is, and so does a constant comparison set.
    With turn_credit="turn", r is a turn's return and the group is the group's turns of one index.
    `batch_stats` (reinforce++) sums {"n", "sum", "sq"} over the learner ranks (default: this rank's alone).
    `std`: "population" divides a variance by n, "unbiased" by n - 1 (verl's and TRL's).
    `role_baselines` / `rae_decay`: the rae estimator's running baselines, one per role, updated in place.
    """
    if turn_credit not in ("episode", "turn"):
        raise ValueError(f"turn_credit must be 'episode' or 'turn', got {turn_credit!r}")
    if std not in ("population", "unbiased"):
        raise ValueError(f"std must be 'population' or 'unbiased', got {std!r}")
    estimate = estimator_named(estimator)
    if silent is None:
        silent = silent_groups(groups, turn_credit=turn_credit, turn_gamma=turn_gamma)
    sets, roles = [], []
    for g, results in groups.items():
        role = results[0].role if results else ""  # a group is one task and one seat: one role
        if turn_credit == "episode":  # a silent group is scored by its (constant) env reward, shaping or not
            score = reward_of if reward_of and g not in silent else (lambda r: r.reward)
            sets.append([(score(r), r.step_samples) for r in results])
            roles.append(role)
            continue
        by_turn: dict[int, list] = defaultdict(list)
        for r in results:
            for s, ret in zip(r.step_samples, turn_returns(r, turn_gamma)):
                by_turn[s.turn].append((ret, [s]))
        sets += by_turn.values()
        roles += [role] * len(by_turn)
    spec = AdvantageSpec(normalize_std=normalize_std, eps=eps, std=std, turn_credit=turn_credit,
                         batch_stats=batch_stats, roles=tuple(roles), role_baselines=role_baselines,
                         rae_decay=rae_decay)
    for items, advs in zip(sets, estimate(sets, spec)):
        for (_, samples), a in zip(items, advs):
            for s in samples:
                s.advantage = a
    return groups


def _constant(items: ComparisonSet) -> bool:
    return len({x for x, _ in items}) <= 1  # exact test: a float mean can differ from r by 1e-17


def _dof(n: float, std: str) -> float:
    """What a sum of n squared deviations is divided by: n, or n - 1 (Bessel's correction) for "unbiased"."""
    return max(n - 1, 1.0) if std == "unbiased" else n


@register_estimator("grpo")
def grpo(sets: list[ComparisonSet], spec: AdvantageSpec) -> list[list[float]]:
    """r - the set's mean, divided by its std + eps with normalize_std (GRPO; verl's compute_grpo_outcome_advantage
    and TRL's GRPOTrainer take torch.std, the unbiased one: spec.std "unbiased")."""
    out = []
    for items in sets:
        rewards = [x for x, _ in items]
        if _constant(items):
            out.append([0.0] * len(items))
            continue
        mean = sum(rewards) / len(rewards)
        std = (sum((x - mean) ** 2 for x in rewards) / _dof(len(rewards), spec.std)) ** 0.5
        out.append([(x - mean) / (std + spec.eps) if spec.normalize_std else x - mean for x in rewards])
    return out


@register_estimator("rloo")
def rloo(sets: list[ComparisonSet], spec: AdvantageSpec) -> list[list[float]]:
    """r - the mean of the set's other rewards (leave-one-out: unbiased, an episode's own reward is not in
    its baseline), i.e. n/(n-1) x (r - mean); no std. A set of one is constant: 0."""
    out = []
    for items in sets:
        total, n = sum(x for x, _ in items), len(items)
        out.append([0.0] * n if _constant(items) else [x - (total - x) / (n - 1) for x, _ in items])
    return out


@register_estimator("reinforce++")
def reinforce_plus_plus(sets: list[ComparisonSet], spec: AdvantageSpec) -> list[list[float]]:
    """REINFORCE++-baseline as verl (verl/trainer/ppo/core_algos.py,
    compute_reinforce_plus_plus_baseline_outcome_advantage) and OpenRLHF (openrlhf/trainer/ppo_utils/
    experience_maker.py, "reinforce_baseline") compute it: a = r - the group's mean, then whitened over every
    response token of the step, (a - m) / (s + eps), m and s the token-weighted mean and std of a (an episode's a
    counts once per token it sampled), constant groups' zeros included. So m is not 0: with rewards [1, 0] and
    10 and 30 tokens, m = -0.25. spec.std: "population" is OpenRLHF's variance, "unbiased" verl's (masked_var).
    A constant set keeps 0 (the references give it -m / s; the update drops it). With learner ranks the token
    sums are the step's (`batch_stats`)."""
    if spec.turn_credit == "turn":
        raise ValueError("reinforce++ normalises over the whole step's tokens; turn credit compares turns of one index")
    centred, tokens = [], []
    for items in sets:
        mean = sum(x for x, _ in items) / max(len(items), 1)
        centred.append([0.0 if _constant(items) else x - mean for x, _ in items])
        tokens.append([sum(len(s.response_ids) for s in samples) for _, samples in items])
    pairs = [(a, n) for advs, ns in zip(centred, tokens) for a, n in zip(advs, ns)]
    stats = {"n": float(sum(n for _, n in pairs)), "sum": sum(a * n for a, n in pairs),
             "sq": sum(a * a * n for a, n in pairs)}
    stats = spec.batch_stats(stats) if spec.batch_stats else stats
    n = max(stats["n"], 1.0)
    m = stats["sum"] / n
    s = (max(stats["sq"] - n * m * m, 0.0) / _dof(n, spec.std)) ** 0.5
    return [[0.0] * len(items) if _constant(items) else [(a - m) / (s + spec.eps) for a in advs]
            for items, advs in zip(sets, centred)]


@register_estimator("rae")
def role_conditioned(sets: list[ComparisonSet], spec: AdvantageSpec) -> list[list[float]]:
    """SPIRAL's role-conditioned advantage (Liu et al. 2025, "SPIRAL: Self-Play on Zero-Sum Games"): per role
    (a game and a seat, RolloutResult.role), b <- decay x b + (1 - decay) x the mean of the step's rewards in that
    role, then a = r - b. A role first seen starts at b = 0 (SPIRAL's). No group is silent under it: an all-win
    group still beats a baseline below 1. The baselines are `spec.role_baselines`, updated in place, so they
    outlive the step (the run keeps them in its checkpoints)."""
    baselines = spec.role_baselines if spec.role_baselines is not None else {}
    roles = spec.roles or ("",) * len(sets)
    by_role: dict[str, list[float]] = defaultdict(list)
    for role, items in zip(roles, sets):
        by_role[role] += [x for x, _ in items]
    for role, rewards in by_role.items():
        baselines[role] = spec.rae_decay * baselines.get(role, 0.0) + (1 - spec.rae_decay) * sum(rewards) / len(rewards)
    return [[x - baselines[role] for x, _ in items] for role, items in zip(roles, sets)]


def overlong_penalty(result: RolloutResult, *, max_new_tokens: int, buffer: int, penalty: float) -> float:
    """DAPO's soft overlong punishment, summed over the episode's turns (<= 0): a response of length n
    loses penalty x (n - (max_new_tokens - buffer)) / buffer once it enters the last `buffer` tokens."""
    if buffer <= 0:
        return 0.0
    start = max_new_tokens - buffer
    return -penalty * sum(max(len(s.response_ids) - start, 0) / buffer for s in result.step_samples)


def turn_returns(result: RolloutResult, gamma: float) -> list[float]:
    """Per step sample: its turn's reward + gamma x the next turn's return. Without a recorded
    Trajectory step for a turn, the episode's final reward counts at its last turn."""
    steps = result.trajectory.steps
    n = len(result.step_samples)
    rewards = [steps[s.turn].reward if s.turn < len(steps) else (result.reward if i == n - 1 else 0.0)
               for i, s in enumerate(result.step_samples)]
    out, ret = [], 0.0
    for r in reversed(rewards):
        ret = r + gamma * ret
        out.append(ret)
    return out[::-1]
