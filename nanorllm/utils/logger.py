"""RunLogger: everything a run writes while it trains, from the one process that trains.

- TensorBoard scalars (namespaced: reward/, loss/, perf/, pipeline/, eval/ ...), the config as a
  text table, and every `sample_every` steps a few whole trajectories as text; the same scalars to
  `metrics.jsonl` and Weights & Biases with `--report-to` (utils/sinks.py);
- one console line per step;
- `rollouts.jsonl`: the most recent episodes, bounded, rewritten atomically, for debugging. Each
  record carries the step it was trained in, so a resumed run cuts the file back to its checkpoint
  (as TensorBoard's purge_step does for the scalars) and no step appears twice.
"""

import json
import os
from collections import deque
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from nanorllm.core.types import RolloutResult
from nanorllm.utils.sinks import JsonlSink, WandbSink


def episode_record(r: RolloutResult) -> dict:
    t = r.trajectory
    return {
        "task_id": t.task_id, "question": t.task.get("question"), "answer": t.task.get("answer"),
        "turns": [{"observation": s.observation, "response": s.model_response, "extracted": s.action,
                   "reward": s.reward, "feedback": s.feedback} for s in t.steps],
        "final_reward": t.final_reward,
        "advantage": r.step_samples[0].advantage if r.step_samples else 0.0,
        "termination_reason": t.termination_reason, "policy_version": r.policy_version,
        "worker_id": r.worker_id, "group_id": r.group_id,
        # what an --agent function returned beside its reward (envs/agent_fn.py; checked to be JSON there)
        **({"returned": t.steps[-1].info["returned"]} if t.steps and "returned" in t.steps[-1].info else {}),
        # a game's seat and who played the other seats (rollout/games.py)
        **({"seat": r.seat, "opponent": r.opponent} if r.seat is not None else {}),
        # the reward sources whose score failed (termination_reason "reward_failed")
        **({"reward_failed": t.steps[-1].info["reward_failed"]} if t.steps and "reward_failed" in t.steps[-1].info
           else {}),
    }


def format_episode(rec: dict) -> str:
    lines = [f"**{rec['task_id']}** (answer {rec['answer']}, reward {rec['final_reward']}, "
             f"advantage {rec['advantage']:.3f}, {rec['termination_reason']}, v{rec['policy_version']})",
             f"> {rec['question']}"]
    for i, turn in enumerate(rec["turns"]):
        lines.append(f"- turn {i}: `{turn['response']}` -> reward {turn['reward']}"
                     + (f", feedback: {turn['feedback']}" if turn["feedback"] else ""))
    return "\n".join(lines)


class RunLogger:
    def __init__(self, run_dir: Path, *, dump_size: int = 512, purge_step: int | None = None,
                 report_to: tuple[str, ...] = ("tensorboard",), config: dict | None = None):
        self.run_dir = Path(run_dir)
        self.writer = SummaryWriter(str(self.run_dir), purge_step=purge_step) if "tensorboard" in report_to else None
        self.sinks = ([JsonlSink(self.run_dir, purge_step=purge_step)] if "jsonl" in report_to else []) + \
                     ([WandbSink(self.run_dir, config=config, resume=purge_step is not None)]
                      if "wandb" in report_to else [])
        self.dump_path = self.run_dir / "rollouts.jsonl"
        self.recent: deque = deque(maxlen=dump_size)
        if self.dump_path.exists():  # a resumed run keeps its history up to the checkpoint
            with open(self.dump_path, encoding="utf-8") as f:
                records = [json.loads(line) for line in f if line.strip()]
            kept = [r for r in records if purge_step is None or r.get("step", 0) < purge_step]
            self.recent.extend(kept)
            if len(kept) < len(records):
                self._write_dump()

    def scalars(self, metrics: dict, step: int) -> None:
        numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        for k, v in numbers.items():
            if self.writer is not None:
                self.writer.add_scalar(k, v, step)
        for sink in self.sinks:
            sink.scalars(numbers, step)

    def text(self, tag: str, text: str, step: int) -> None:
        if self.writer is not None:
            self.writer.add_text(tag, text, step)

    def episodes(self, results: list[RolloutResult], step: int, *, log_text: bool, n_text: int = 4) -> None:
        records = [{**episode_record(r), "step": step} for r in results]
        self.recent.extend(records)
        self._write_dump()
        if log_text:
            self.text("samples", "\n\n".join(format_episode(r) for r in records[:n_text]), step)

    def _write_dump(self) -> None:
        tmp = self.dump_path.with_suffix(".jsonl.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                for rec in self.recent:
                    f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            os.replace(tmp, self.dump_path)
        except BaseException:  # the last complete dump stays; no half-written file is left beside it
            tmp.unlink(missing_ok=True)
            raise

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        for sink in self.sinks:
            sink.close()
