"""A reasoning-gym dataset through its adapter vs the same questions as a JSONL file through the math env, side by
side in one run (`launch/bench.py adapters`).

The same held-out items run twice on one policy: once as `--env reasoning-gym:NAME` (questions drawn from the
dataset, each answer scored by the dataset's own `score_answer`, rebuilt from the row's spec in the process that
scores it) and once as a JSONL task file of the same questions and gold answers through `--env math` (graded by the
math grader). Both get the same system prompt, no worked example and one turn, so they render the same prompt
tokens and, drawing each episode's random stream the same way, sample the same tokens: the difference in wall time
is what the adapter's scoring and rows cost against the math env's. Figures: episodes/s of each (the fastest of
`repeats` alternating runs), their ratio, and whether the tokens sampled were the same.
"""

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from nanorllm.bench.paired import PairedConfig
from nanorllm.bench.record import record_run
from nanorllm.envs.base import EpisodeSettings
from nanorllm.envs.registry import load_env
from nanorllm.policy.base import SamplingParams
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.utils.devices import configure_threads

SYSTEM_PROMPT = "Answer the question. Give only the final answer."
TARGET = 0.05  # the adapter within 5% of the JSONL file's episodes/s


@dataclass
class AdapterBenchConfig(PairedConfig):
    dataset: str = "chain_sum"
    """The reasoning-gym dataset whose held-out items both runs play."""


def _timed(engine: RolloutEngine, tasks: list[dict], seed: int) -> dict:
    t0 = time.perf_counter()
    out = engine.run(tasks, num_samples=1, seed=seed)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "episodes_per_s": len(out.results) / wall, "gen_tokens": out.timings["gen_tokens"],
            "responses": [s.response_ids for r in out.results for s in r.step_samples],
            "env_errors": sum(r.trajectory.termination_reason == "error" for r in out.results)}


def run_adapter_bench(cfg: AdapterBenchConfig) -> int:
    from nanorllm.policy.hf_causal import HFCausalPolicy

    t_start = time.perf_counter()
    configure_threads("cpu", cfg.threads, 1)
    policy = HFCausalPolicy.from_name(cfg.model)
    settings = EpisodeSettings(max_turns=1, system_prompt=SYSTEM_PROMPT, worked_example=False)
    rg = load_env(f"reasoning-gym:{cfg.dataset}", settings)
    rg_tasks = rg.load_tasks(f"rg:{cfg.dataset},size={cfg.episodes},seed=2")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tasks.jsonl"
        path.write_text("".join(json.dumps({"task_id": t["task_id"], "question": t["question"],
                                            "answer": t["answer"]}) + "\n" for t in rg_tasks))
        math = load_env("math", settings)
        jsonl_tasks = math.load_tasks(str(path))
    sampling = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
    engines = {name: RolloutEngine(policy, sampling=sampling, env=env, max_batch_episodes=cfg.episodes)
               for name, env in (("adapter", rg), ("jsonl", math))}
    tasks = {"adapter": rg_tasks, "jsonl": jsonl_tasks}
    for name in engines:  # warm-up: the dataset build, the grader's import, the cache
        _timed(engines[name], tasks[name][:2], cfg.seed)
    runs = [{name: _timed(engines[name], tasks[name], cfg.seed) for name in engines} for _ in range(cfg.repeats)]
    best = {name: min((r[name] for r in runs), key=lambda f: f["wall_s"]) for name in engines}
    same = best["adapter"]["responses"] == best["jsonl"]["responses"]
    ratio = best["adapter"]["episodes_per_s"] / best["jsonl"]["episodes_per_s"]
    for name, label in (("adapter", f"--env reasoning-gym:{cfg.dataset}"), ("jsonl", "--env math, JSONL file")):
        f = best[name]
        print(f"[bench] {label}: {len(tasks[name])} episodes in {f['wall_s']:.2f} s = {f['episodes_per_s']:.2f} "
              f"episodes/s | {f['gen_tokens']} tokens | {f['env_errors']} env errors")
    walls = {name: ", ".join(f"{r[name]['wall_s']:.2f}" for r in runs) for name in engines}
    print(f"[bench] adapter / JSONL episodes/s = {ratio:.3f} (target >= {1 - TARGET:.2f}; same tokens sampled: "
          f"{same}; walls of {cfg.repeats} alternating runs each: adapter {walls['adapter']} s, jsonl {walls['jsonl']} s)")
    figures = {name: {k: v for k, v in f.items() if k != "responses"} for name, f in best.items()}
    figures.update({"ratio": ratio, "same_tokens": same, "target_ratio": 1 - TARGET, "met": ratio >= 1 - TARGET,
                    "walls_s": {name: [r[name]["wall_s"] for r in runs] for name in engines}})
    record_run(figures, t_start, cfg.json, model=cfg.model, dataset=cfg.dataset, episodes=cfg.episodes,
               threads=cfg.threads)
    return 0
