"""The decode engine's figures on one GPU: `python launch/bench.py --gpu` (<= 6 min on one H200).

Each figure is measured beside what bounds it, in this one run:
  decode_ms[engine][B]   one decode step (sample + forward + the host's bookkeeping) at B rows, for the
                         DecodeBatch ("eager", the engine before the slot cache) and the SlotBatch
                         ("graphs": its step replayed from a CUDA graph; on CPU it runs eagerly)
  eager_rollout_tokens_per_s  the same rollout on the DecodeBatch, first model only
  rollout[model]         generated tokens/s of a 256-episode two-turn rollout (32 tasks x 8 samples, the
                         training engine) for the default model (when installed) and each preset, with
                         the transformers reference (static-cache `generate` on the same first prompts) and
                         the upper bound (the captured 256-row step replayed back to back: a token a live row
                         a replay, the idle shared-prefix slot not counted)
  busy_frac              GPU kernel time / wall time over one rollout under torch.profiler, whose own
                         overhead is in that wall time: a lower bound on how busy the unprofiled GPU is
  capture_s              time to capture every batch-size bucket's graph
  greedy_same            of 32 greedy episodes, how many the graph engine samples exactly as eager does
  learner                the update of 256 episodes: seconds, tokens/s and MFU for fp32, TF32 and bf16
                         (nanorllm/bench/gpu_learner.py)
  weights                weight publish + one worker load on the same GPU, beside one plain copy of the
                         same bytes (nanorllm/bench/gpu_weights.py)

`--dry-run` (or `--device cpu`): tiny-random, tiny sizes, CPU, under a minute: checks that every
measurement runs. Its numbers say nothing about a GPU.

The JSON is rewritten (atomically) after every figure, with `"complete": false` until the last: a run
stopped by its time limit keeps every figure it measured.
"""

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import torch

from nanorllm.bench import gpu_learner, gpu_weights
from nanorllm.bench.decode_batch import ReferencePolicy
from nanorllm.config import TrainConfig
from nanorllm.datasets.tasks import load_tasks
from nanorllm.config.specs import task_specs
from nanorllm.policy.base import SamplingParams
from nanorllm.policy.decode_graphs import layout, params_key
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.policy.models import SMOLLM2, cache_dir, smollm2_gguf_dir
from nanorllm.trainer.training_engine import training_engine
from nanorllm.utils.devices import synchronize
from nanorllm.utils.files import write_atomic

PRESETS = ("preset:smollm2-135m", "preset:qwen2.5-0.5b", "preset:qwen2.5-1.5b")


@dataclass
class GpuBenchConfig:
    dry_run: bool = False
    """Tiny-random on CPU at tiny sizes: every measurement runs, in under a minute."""
    device: str = "cuda"
    """Where to measure; `cpu` implies --dry-run."""
    json: str | None = "runs/bench_gpu.json"
    """Also write the figures here."""
    dtype: str = "bfloat16"
    """Replica dtype (workers sample in it)."""
    batch_sizes: tuple[int, ...] = (16, 32, 64, 128, 256)
    """Rows per decode step in the ms/step sweep."""
    models: tuple[str, ...] = field(default_factory=lambda: (SMOLLM2, *PRESETS))
    """Rollout models (the default model is skipped when not installed)."""
    tasks_per_step: int = 32
    num_samples_per_task: int = 8



def _installed(model: str) -> bool:
    if model != SMOLLM2:
        return True
    try:
        smollm2_gguf_dir()
        return True
    except FileNotFoundError:
        return (cache_dir() / SMOLLM2 / "config.json").exists()


def decode_ms(policy: HFCausalPolicy, engine: str, rows: int, prompt: list[int], *, steps: int) -> float:
    """Median ms of one step() at `rows` rows that never finish (ignore_eos, a long max_new_tokens)."""
    params = SamplingParams(max_new_tokens=10_000, temperature=1.0, ignore_eos=True)
    times = []
    source = ReferencePolicy(policy) if engine == "dynamic" else policy
    with source.decode_batch(params, slots=rows + 1, width=len(prompt) + 2 * steps + 16) as batch:
        batch.join([(i, prompt, torch.Generator().manual_seed(i), None) for i in range(rows)])
        for k in range(steps + 3):  # 3 warm-up steps (the graph engine captures its bucket here)
            synchronize(policy.device.type)
            t0 = time.perf_counter()
            batch.step()
            synchronize(policy.device.type)
            if k >= 3:
                times.append(time.perf_counter() - t0)
    return 1000 * sorted(times)[len(times) // 2]


def rollout_tokens_per_s(policy: HFCausalPolicy, cfg: TrainConfig, tasks: list[dict], decode_engine: str) -> float:
    """tokens/s of one fixed-length rollout on `decode_engine`, after a warm-up one."""
    engine = training_engine(ReferencePolicy(policy) if decode_engine == "dynamic" else policy, cfg)
    engine.sampling = replace(engine.sampling, ignore_eos=True)
    engine.run(tasks, num_samples=cfg.num_samples_per_task, seed=0)
    synchronize(policy.device.type)
    t0 = time.perf_counter()
    results = engine.run(tasks, num_samples=cfg.num_samples_per_task, seed=1).results
    synchronize(policy.device.type)
    return sum(len(s.response_ids) for r in results for s in r.step_samples) / (time.perf_counter() - t0)


def rollout_figures(policy: HFCausalPolicy, cfg: TrainConfig, tasks: list[dict], *, dry: bool) -> dict:
    """tokens/s of one rollout (after a warm-up one), with its busy fraction, capture time, the
    transformers reference and the replayed-step upper bound."""
    engine = training_engine(policy, cfg)
    engine.sampling = replace(engine.sampling, ignore_eos=True)  # fixed length: random weights never stop
    dev = policy.device.type
    capture_s = engine.prepare(tasks[0], len(tasks) * cfg.num_samples_per_task)
    engine.run(tasks, num_samples=cfg.num_samples_per_task, seed=0)  # warm-up
    synchronize(dev)
    t0 = time.perf_counter()
    batch = engine.run(tasks, num_samples=cfg.num_samples_per_task, seed=1)
    results, t = batch.results, batch.timings
    synchronize(dev)
    wall = time.perf_counter() - t0
    tokens = sum(len(s.response_ids) for r in results for s in r.step_samples)
    out = {"tokens_per_s": tokens / wall, "tokens": tokens, "wall_s": wall, "capture_s": capture_s,
           "turns_per_episode": sum(len(r.step_samples) for r in results) / len(results),
           "graph_steps_frac": t.get("graph_steps", 0) / max(t["decode_steps"], 1)}
    if dev == "cuda":
        out["busy_frac"] = guarded(busy_fraction, lambda: engine.run(tasks, num_samples=cfg.num_samples_per_task, seed=2))
    out["decode_context"] = t.get("attended_columns", 0) / max(t["decode_steps"], 1)  # mean columns a step read
    out["upper_bound_tokens_per_s"] = guarded(replay_bound, policy, engine, tasks[0], rows=len(results),
                                              context=out["decode_context"])
    out["hf_generate_tokens_per_s"] = guarded(hf_reference, policy, engine, tasks, cfg, dry=dry)
    return out


def guarded(fn, *args, **kwargs):
    """fn's figure, or the error that stopped it: one failed measurement must not cost the others."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        print(f"[bench gpu] {fn.__name__} failed: {type(e).__name__}: {e}", flush=True)
        return {"error": f"{type(e).__name__}: {e}"}


def busy_fraction(fn) -> float:
    """CUDA kernel time / wall time while `fn` runs under the profiler (its overhead is in the wall time)."""
    from torch.profiler import ProfilerActivity, profile

    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    kernel_us = sum(e.device_time_total for e in prof.key_averages() if e.device_time_total > 0
                    and e.device_type == torch.autograd.DeviceType.CUDA)
    return kernel_us / 1e6 / wall


def replay_bound(policy: HFCausalPolicy, engine, task: dict, *, rows: int, context: float,
                 replays: int = 50) -> float:
    """`rows` tokens per step: the captured step with the most rows, at the context bucket that covers
    the rollout's mean context (`context` columns), replayed back to back (on CPU, the eager step
    function run back to back). A step over n slots makes a token for each of the `rows` live ones
    only: the shared prompt prefix's slot (the n-th at 256 episodes) is idle in every step."""
    graphs = policy.decode_graphs
    live = layout(policy.slot_cache, policy.model)
    ours = {k[:2]: g for k, g in (graphs.graphs.items() if graphs else ())
            if k[2:] == (params_key(engine.sampling), live)}  # the rollout's sampling, live cache and weights
    if ours:
        most = max(n for n, _ in ours)
        widths = sorted(w for n, w in ours if n == most)
        g = ours[most, next((w for w in widths if w >= context), widths[-1])]
        g.replay()
        synchronize(policy.device.type)
        t0 = time.perf_counter()
        for _ in range(replays):
            g.replay()
        synchronize(policy.device.type)
        return min(g.n, rows) * replays / (time.perf_counter() - t0)
    width = engine.slot_width(64)
    with policy.decode_batch(engine.sampling, slots=rows + 1, width=width) as batch:
        dev = batch.device
        tok = torch.zeros(rows, dtype=torch.long, device=dev)
        pos = torch.full((rows,), width // 2, device=dev)
        slots = torch.arange(rows, device=dev)
        u = torch.full((rows,), 0.5, device=dev)
        replays = 5
        t0 = time.perf_counter()
        for _ in range(replays):
            batch.decode_step(tok, pos, slots, width, lambda: u)
        return rows * replays / (time.perf_counter() - t0)


def hf_reference(policy: HFCausalPolicy, engine, tasks: list[dict], cfg: TrainConfig, *, dry: bool) -> float:
    """tokens/s of transformers' own `generate` (static cache, sampling, fixed length) on the same
    first-turn prompts, in chunks of max_batch_episodes. Eager: with a static cache on CUDA, transformers
    would compile the decode forward (`_valid_auto_compile_criteria`), an inductor compile inside the
    timed call."""
    prompts = []
    for task in tasks:
        agent = engine.env.make_agent()
        agent.reset(task, engine.env.make_env().reset(task))
        prompts += [policy.first_prompt_ids(agent.messages)] * cfg.num_samples_per_task
    n_new, model, pad = cfg.max_new_tokens, policy.model, policy.pad_id
    tokens, t0 = 0, time.perf_counter()
    with torch.no_grad(), policy.autocast():
        for i in range(0, len(prompts), cfg.max_batch_episodes):
            chunk = prompts[i:i + cfg.max_batch_episodes]
            T = max(map(len, chunk))
            ids = torch.tensor([[pad] * (T - len(p)) + p for p in chunk], device=policy.device)
            mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in chunk], device=policy.device)
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n_new, min_new_tokens=n_new,
                                 do_sample=True, temperature=cfg.temperature, top_k=0, pad_token_id=pad,
                                 cache_implementation="static" if not dry else None,
                                 disable_compile=True)  # a static cache on CUDA auto-compiles the forward
            tokens += (out.shape[1] - T) * len(chunk)
    synchronize(policy.device.type)
    return tokens / (time.perf_counter() - t0)


def greedy_same(policy: HFCausalPolicy, cfg: TrainConfig, tasks: list[dict], n: int = 32) -> int:
    """Of n greedy episodes, how many the graph engine samples exactly as the eager slot engine does."""
    engine = training_engine(policy, cfg)
    engine.sampling = replace(engine.sampling, greedy=True)
    runs = []
    for graphs in (False, True):
        policy.graphs_enabled = graphs
        policy.decode_graphs = None
        res = engine.run(tasks[:n], num_samples=1, seed=0).results
        runs.append([[s.response_ids for s in r.step_samples] for r in res])
    policy.graphs_enabled = True
    return sum(a == b for a, b in zip(*runs))


def versions() -> dict:
    """What the figures were measured with: the kernels and the model code depend on these."""
    import transformers

    return {"torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__}


def run(b: GpuBenchConfig, on_figure: Callable[[dict], None] = lambda figures: None) -> dict:
    """Every figure; `on_figure(figures)` after each one is measured."""
    dry = b.dry_run or b.device == "cpu"
    device = "cpu" if dry else b.device
    if not dry and not torch.cuda.is_available():
        raise SystemExit("--gpu needs a GPU (use --dry-run to check the script on CPU)")
    models = ("tiny-random",) if dry else tuple(m for m in b.models if _installed(m))
    sizes = (2, 4) if dry else b.batch_sizes
    cfg = replace(TrainConfig(), tasks_per_step=2 if dry else b.tasks_per_step,
                  num_samples_per_task=2 if dry else b.num_samples_per_task, max_new_tokens=6 if dry else 32,
                  max_turns=2, max_batch_episodes=4 if dry else 256)
    tasks = load_tasks(task_specs(cfg)[0], limit=max(cfg.tasks_per_step, 32))
    figures: dict = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "dry_run": dry,
                     "dtype": b.dtype, "versions": versions(), "rollout": {}, "decode_ms": {}}
    for i, model in enumerate(models):
        print(f"[bench gpu] {model} ...", flush=True)
        t0 = time.perf_counter()
        policy = HFCausalPolicy.from_name(model, device=device, dtype="float32" if dry else b.dtype, replica=True)
        figures.setdefault("load_s", {})[model] = time.perf_counter() - t0
        on_figure(figures)
        if i == 0:  # the sweep, agreement and capture on the first model (the default one when installed)
            prompt = policy.first_prompt_ids([{"role": "user", "content": tasks[0]["question"]}])
            for engine in ("dynamic", "slots"):
                figures["decode_ms"][{"dynamic": "eager", "slots": "graphs"}[engine]] = {
                    rows: guarded(decode_ms, policy, engine, rows, prompt, steps=3 if dry else 10) for rows in sizes}
                on_figure(figures)
            figures["greedy_same_of_32"] = guarded(greedy_same, policy, cfg, tasks, n=4 if dry else 32)
            on_figure(figures)
            figures["eager_rollout_tokens_per_s"] = guarded(rollout_tokens_per_s, policy, cfg,
                                                            tasks[:cfg.tasks_per_step], "dynamic")
            on_figure(figures)
        policy.decode_graphs = None  # capture for the rollout's sizes
        figures["rollout"][model] = guarded(rollout_figures, policy, cfg, tasks[:cfg.tasks_per_step], dry=dry)
        print(f"[bench gpu] {model}: {json.dumps(figures['rollout'][model], default=float)}", flush=True)
        on_figure(figures)
        del policy
        if device == "cuda":
            torch.cuda.empty_cache()
    print("[bench gpu] learner update and weight broadcast ...", flush=True)
    figures["learner"] = guarded(gpu_learner.figures, device, dry)  # update s, tokens/s, MFU per precision
    on_figure(figures)
    figures["weights"] = guarded(gpu_weights.figures, device, dry)  # publish + load ms beside one copy
    return figures


def run_gpu_bench(b: GpuBenchConfig) -> int:
    """Every figure, printed and (with b.json) recorded with the date and the total time, the file
    rewritten after each figure (`complete` false until the last)."""
    t0 = time.perf_counter()
    record = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "complete": False, "total_s": 0.0,
              "figures": {}}

    def save(figures: dict) -> None:
        record["figures"], record["total_s"] = figures, time.perf_counter() - t0
        if b.json:
            Path(b.json).parent.mkdir(parents=True, exist_ok=True)
            write_atomic(Path(b.json), json.dumps(record, indent=2, default=float) + "\n")

    figures = run(b, on_figure=save)
    record["complete"] = True
    save(figures)
    print(json.dumps(record, indent=2, default=float))
    return 0
