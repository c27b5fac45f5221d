"""Outcome metrics of a batch of episodes, named as GRPO users already read them."""

from collections import Counter

from nanorllm.algos.groups import group_by_task_id
from nanorllm.core.types import RolloutResult, Unplayed
from nanorllm.rollout.games import outcome
from nanorllm.trainer.collapse import distinct_answers

TERMINATION_REASONS = ("correct", "max_turns", "truncated", "error", "reward_failed")


def grader_timeouts(results: list[RolloutResult]) -> tuple[int, str | None]:
    """(answer checks that ran out of CPU time, the task id of the first one)."""
    hit = [(r.trajectory.task_id, n) for r in results
           if (n := sum(bool(st.info.get("grader_timeout")) for st in r.trajectory.steps))]
    return sum(n for _, n in hit), (hit[0][0] if hit else None)


def prefix_breaks(results: list[RolloutResult]) -> int:
    """Turns whose prompt does not extend the previous turn's prompt + response token for token (an agent
    that rewrote its history): each starts a training row of its own (trainer/collate.py)."""
    n = 0
    for r in results:
        for prev, s in zip(r.step_samples, r.step_samples[1:]):
            before = prev.prompt_ids + prev.response_ids
            n += s.prompt_ids[:len(before)] != before
    return n


def rollout_metrics(results: list[RolloutResult], env=None) -> dict:
    """Outcome scalars of a step's episodes, with the env bundle's own (`env.metrics`) when given."""
    if not results:
        return {}
    n = len(results)
    rewards = [r.reward for r in results]
    mean = sum(rewards) / n
    samples = [s for r in results for s in r.step_samples]
    lengths = [len(s.response_ids) for s in samples]
    m = {
        "reward/mean": mean,
        "reward/std": (sum((x - mean) ** 2 for x in rewards) / n) ** 0.5,
        "success_rate": sum(r.succeeded for r in results) / n,
        "success_rate/first_turn": sum(r.first_turn_succeeded for r in results) / n,
        "episode/num_turns": sum(r.trajectory.num_turns for r in results) / n,
        "completions/mean_length": sum(lengths) / max(len(lengths), 1),
        "completions/clipped_ratio": sum(s.truncated for s in samples) / max(len(samples), 1),
        # answer checks that ran out of CPU time (scored 0): should stay 0
        "reward/grader_timeouts": grader_timeouts(results)[0],
    }
    reasons = Counter(r.trajectory.termination_reason for r in results)
    m["rollout/env_errors"] = reasons["error"]  # episodes the env raised in: left out of training
    m["rollout/prefix_breaks"] = prefix_breaks(results)
    m["rollout/agent_timeouts"] = sum(any(st.info.get("agent_timeout") for st in r.trajectory.steps) for r in results)
    # episodes ended because their next turn would pass the row's bound (rollout/row_bound.py)
    m["rollout/context_overflows"] = sum(any(st.info.get("context_overflow") for st in r.trajectory.steps)
                                         for r in results)
    for reason in sorted(set(TERMINATION_REASONS) | set(reasons)):  # always all, so curves have no gaps
        m[f"episode/termination/{reason}"] = reasons[reason] / n
    groups = group_by_task_id(results).values()
    solved = [sum(r.succeeded for r in g) / len(g) for g in groups]
    m["groups/solve_none"] = sum(s == 0 for s in solved) / len(solved)
    m["groups/solve_all"] = sum(s == 1 for s in solved) / len(solved)
    m["groups/solve_partial"] = sum(0 < s < 1 for s in solved) / len(solved)
    if (distinct := distinct_answers(results)) is not None:  # 1.0 for long: a constant answer (trainer/collapse.py)
        m["rollout/distinct_answers"] = distinct
    m.update(selfplay_metrics(results))
    if env is not None:
        m.update(env.metrics(results))
    return m


def selfplay_metrics(results: list[RolloutResult], unplayed: list[Unplayed] = ()) -> dict:
    """A game's policy seats (rollout/games.py; {} for one-player episodes), against the run's opponent: each seat's
    share of wins (and under --opponent pool against each snapshot the step's games met, newest first), the share
    of draws, and the share of episodes with a move that broke the game's rules. Over the scored episodes (an env
    error says nothing of the play) and, for the win and draw shares, the `unplayed` seats (RolloutBatch.unplayed:
    the seats their games ended before they moved; held-out evaluation passes them)."""
    played = [r for r in results if r.seat is not None and not r.failed]
    if not played and not unplayed:
        return {}
    seats = [r.seat for r in played] + [u.seat for u in unplayed]
    outcomes = [r.trajectory.steps[-1].info.get("outcome") if r.trajectory.steps else None for r in played]
    outcomes += [outcome(u.reward) for u in unplayed]
    m = {}
    for seat in sorted(set(seats)):
        mine = [o for s, o in zip(seats, outcomes) if s == seat]
        m[f"selfplay/win_rate/seat{seat}"] = sum(o == "win" for o in mine) / len(mine)
    snapshots = sorted({r.opponent for r in played if (r.opponent or "").startswith("pool:")},
                       key=lambda name: -int(name.rsplit("_", 1)[1]))  # --opponent pool's, newest first
    for age, name in enumerate(snapshots):
        mine = [o for r, o in zip(played, outcomes) if r.opponent == name]
        m[f"selfplay/win_rate/vs_pool{age}"] = sum(o == "win" for o in mine) / len(mine)
    m["selfplay/draw_rate"] = sum(o == "draw" for o in outcomes) / len(outcomes)
    if played:  # a seat that never moved broke no rule: over the episodes played
        m["selfplay/invalid_move_rate"] = sum(any(s.info.get("invalid_move") for s in r.trajectory.steps)
                                              for r in played) / len(played)
    return m


def decode_useful_frac(timings: dict) -> float:
    """Tokens kept that were sampled from decode-step logits (all but each turn's first, which comes
    from its prefill) / rows computed in decode steps. Counted apart, at sampling and at the forward:
    a finished row still computed would pull it below 1."""
    return (timings["tokens_kept"] - timings["prefills"]) / max(timings["decode_rows"], 1)


def decode_metrics(job_timings: list[dict]) -> dict:
    """Decode efficiency of a step from each engine call's timings (one per serial step or worker job)."""
    jobs = [t for t in job_timings if t.get("decode_rows")]
    if not jobs:
        return {}
    total = {k: sum(t.get(k, 0) for t in jobs) for k in ("tokens_kept", "prefills", "decode_rows", "decode_steps",
                                                         "graph_steps", "computed_rows", "attended_columns")}
    m = {"perf/decode_useful_frac": decode_useful_frac(total),
         # share of decode steps replayed from CUDA graphs: 0 on CPU, or after a capture failed
         "perf/graphs": total["graph_steps"] / max(total["decode_steps"], 1)}
    if total["computed_rows"]:  # the slot engine: its steps also compute idle slots below the highest live one
        m["perf/decode_live_frac"] = total["decode_rows"] / total["computed_rows"]
        m["perf/decode_context"] = total["attended_columns"] / max(total["decode_steps"], 1)
    return m
