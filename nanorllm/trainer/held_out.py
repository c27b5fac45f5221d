"""A run's held-out evaluations: at step 0, every --eval-every steps and at the end, each set logged as eval/...
scalars and printed in one line, the first and the last recorded in the run folder's eval.json."""

import json
import time
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Callable

from nanorllm.config import TrainConfig
from nanorllm.config.specs import sampling_params
from nanorllm.envs.base import EnvBundle
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.trainer.evaluate import evaluate, evaluate_sampled, json_ready, success_gain
from nanorllm.trainer.training_engine import eval_opponent_model
from nanorllm.utils.files import write_atomic
from nanorllm.utils.logger import RunLogger


@dataclass
class HeldOutEval:
    """The held-out set (`tasks`) and each --eval-set (`sets`: evaluated, not removed from training) of a run."""
    cfg: TrainConfig
    policy: HFCausalPolicy
    env: EnvBundle
    tasks: list[dict]
    sets: dict[str, list[dict]]
    logger: RunLogger
    run_dir: Path
    say: Callable[[str], None]

    HANG_S = 600.0  # held-out eval without progress this long is hung, unless --worker-timeout-s says

    @cached_property
    def opponent(self):
        """A game's --eval-opponent when it is a model (the base by default), frozen, loaded at the first evaluation
        and kept: None for self, random or a one-player env."""
        return eval_opponent_model(self.policy, self.cfg, self.env)

    def before(self, start_step: int) -> None:
        """Held-out eval at step 0 (not again on resume), recorded in eval.json."""
        if start_step == 0:
            self.write_summary(self.evaluate(0), None)

    def evaluate(self, step: int) -> dict | None:
        """The held-out set's results (greedy, and pass@k with --eval-samples), with each --eval-set's under
        "sets"; None when there is nothing to evaluate."""
        if not self.tasks and not self.sets:
            return None
        res = self.evaluate_set("", self.tasks, step) if self.tasks else {}
        if self.sets:
            res["sets"] = {name: self.evaluate_set(name, tasks, step) for name, tasks in self.sets.items()}
        return res

    def evaluate_set(self, name: str, tasks: list[dict], step: int) -> dict:
        """One set, logged as eval/... (the held-out set, name '') or eval/<name>/..."""
        t0 = time.perf_counter()
        res = self.results(tasks)
        prefix = f"eval/{name}/" if name else "eval/"
        self.logger.scalars({f"{prefix}{k}": v for k, v in res.items() if k != "n"}, step)
        self.report(f" {name}" if name else "", step, res, time.perf_counter() - t0)
        return res

    def results(self, tasks: list[dict]) -> dict:
        """Greedy results on `tasks`, with --eval-samples the sampled pass@k and mean@n beside them."""
        cfg, hang_s = self.cfg, self.cfg.worker_timeout_s or self.HANG_S
        res = evaluate(self.policy, tasks, sampling=sampling_params(cfg), env=self.env,
                       max_batch_episodes=cfg.max_batch_episodes, hang_timeout_s=hang_s, opponent_policy=self.opponent)
        if cfg.eval_samples:
            res.update(evaluate_sampled(self.policy, tasks, env=self.env, samples=cfg.eval_samples,
                                        sampling=replace(sampling_params(cfg), temperature=cfg.eval_temperature),
                                        ks=cfg.eval_k, seed=cfg.seed, opponent_policy=self.opponent,
                                        max_batch_episodes=cfg.max_batch_episodes, hang_timeout_s=hang_s))
        return res

    def report(self, label: str, step: int, res: dict, seconds: float) -> None:
        """The set's console line, after a [grader] line when answer checks ran out of CPU time."""
        if res["grader_timeouts"]:
            self.say(f"[grader] held-out eval{label} at step {step}: {res['grader_timeouts']} answer check(s) ran out "
                     f"of --grader-timeout-s {self.cfg.grader_timeout_s:g} (scored 0); first: task "
                     f"{res['first_timeout_task']}")
        sampled = "".join(f" | {k} {v:.3f}" for k, v in res.items() if k.startswith(("pass@", "mean@")))
        failed = "".join(f" | {k.replace('_', ' ')} {res[k]} (not scored: left out)"
                         for k in ("failed", "sampled_failed") if res.get(k))
        self.say(f"[eval{label}] step {step} | success {res['success_rate']:.3f} | first turn "
                 f"{res['first_turn_success']:.3f} | turns {res['mean_turns']:.2f}{sampled} | n {res['n']}{failed} | "
                 f"{seconds:.1f} s")

    def write_summary(self, before: dict | None, after: dict | None) -> None:
        """eval.json: `before` unless it holds one already, `after`, and the gain between them."""
        summary = self.summary()
        if before is not None and "before" not in summary:
            summary["before"] = json_ready(before)
        if after is not None:
            summary["after"] = json_ready(after)
        summary.update(success_gain(summary))
        write_atomic(self.run_dir / "eval.json", json.dumps(summary, indent=2) + "\n")

    def summary(self) -> dict:
        """eval.json's content ({} before it is written)."""
        path = self.run_dir / "eval.json"
        return json.loads(path.read_text()) if path.exists() else {}
