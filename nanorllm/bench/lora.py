"""LoRA benchmark: a full fine-tune and `--lora-rank R` side by side, in one run, on one batch.

    python launch/bench.py --lora [--quick] [--json runs/lora.json]
    python launch/bench.py --lora --model preset:qwen2.5-1.5b --dtype bf16 --modes lora --tasks 2 --samples 2

Every measurement runs in a fresh spawned process, one after the other, so a peak RSS is that mode's
alone. The learner processes train the same episodes (sampled once here from the base model, rewards
alternated so every sample has a gradient); the worker processes decode the same prompts.

Figures (ratios are LoRA / full fine-tune):
  learner_state_ratio    weights + gradients + AdamW state bytes (counted from the live tensors after
                         an update; a gradient is the size of its parameter)
  learner_rss_ratio      peak RSS of the learner process (model load, two updates; micro-batches as a run
                         sizes them); learner_rss_now_ratio: its resident memory after the updates
  publish_bytes_ratio    bytes the shared weight store carries per publish
  publish_load_ratio     one publish + one worker load, seconds (median of 5)
  update_time_ratio      seconds of the second update (the first warms up)
  decode_unmerged_vs_base  tokens/s of a worker with adapters applied by peft's forward / the plain model
  decode_merged_vs_base  tokens/s with the adapters merged into the weights / the plain model (the three
                         interleaved round by round in one process, medians: load from other processes
                         falls on all three alike)
  merge_s                what merged-from-pristine costs at every publish: restore each adapted weight
                         from its pristine copy and add scale x B @ A (seconds)
  pristine_bytes         the extra memory a merged worker holds: the pristine copy of every adapted weight
and each worker's peak and final RSS (plain, unmerged, merged: one fresh process each, one decode).
"""

import time
from dataclasses import dataclass

import torch

from nanorllm.bench.record import median, record_run
from nanorllm.bench.rss import peak_rss_bytes, rss_now_bytes
from nanorllm.bench.spawned import spawned_answer
from nanorllm.config import TrainConfig
from nanorllm.datasets.tasks import load_tasks
from nanorllm.config.specs import task_specs
from nanorllm.pipeline.weights import SharedWeights
from nanorllm.policy.base import SamplingParams
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.config.specs import lora_spec
from nanorllm.policy.lora import trainable_parameters
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.trainer.step import train_step
from nanorllm.trainer.update import make_optimizer


@dataclass
class LoraBenchConfig:
    quick: bool = False
    """tiny-random and a small batch: checks that every measurement runs (its figures are not the reference)."""
    model: str = "smollm2-135m-instruct"
    """Model (ignored with --quick)."""
    rank: int = 16
    """LoRA rank (alpha 2 x rank, every attention and MLP projection: the run's defaults)."""
    dtype: str = "float32"
    """--dtype of both runs (bf16: a LoRA base in bf16, a full fine-tune's fp32 master weights)."""
    modes: str = "full,lora"
    """Learner modes to measure: 'full,lora', or 'lora' alone for a model whose full fine-tune does not fit."""
    tasks: int = 4
    """Tasks in the update's batch (x --samples episodes, 2 turns, --new-tokens a turn)."""
    samples: int = 4
    """Episodes per task."""
    new_tokens: int = 32
    """Tokens a turn in the batch, and a decode row's length."""
    decode_rows: int = 32
    """Rows of the decode measurement (one default step's episodes)."""
    rounds: int = 3
    """Interleaved decode rounds (plain, unmerged, merged in each); the median of each is reported."""
    threads: int = 1
    """Torch threads of each measuring process: what a learner or a worker of the default run gets on 2 cores (on
    a loaded machine more threads measure the waits of OpenMP barriers, not the work)."""
    json: str | None = None
    """Also write the figures here."""


def _cfg(b: LoraBenchConfig, mode: str) -> TrainConfig:
    """The run's settings (micro-batches as a run sizes them) with `mode`'s LoRA rank."""
    return TrainConfig(model=_model(b), dtype=b.dtype, lora_rank=b.rank if mode == "lora" else 0,
                       drop_zero_std_groups=False, lr=1e-5, temperature=1.0, threads=b.threads)


def _model(b: LoraBenchConfig) -> str:
    return "tiny-random" if b.quick else b.model


def _start(cfg: TrainConfig) -> None:
    torch.set_num_threads(cfg.threads)
    torch.set_flush_denormal(True)


def _learner_main(cfg: TrainConfig, results: list, out) -> None:
    """One learner: load, two updates of `results`, then what a publish moves to a worker and takes."""
    _start(cfg)
    lora = lora_spec(cfg)
    policy = HFCausalPolicy.from_name(cfg.model, dtype=cfg.dtype, lora=lora)
    opt = make_optimizer(policy, cfg)
    times = [train_step(policy, opt, results, cfg)["perf/train_s"] for _ in range(2)]
    trained = trainable_parameters(policy.model)
    state = {"weights": sum(p.numel() * p.element_size() for p in policy.model.parameters()),
             "grads": sum(p.numel() * p.element_size() for _, p in trained),
             "optimizer": sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                              if torch.is_tensor(t))}
    rss, rss_now = peak_rss_bytes(), rss_now_bytes()  # before the replica below, which a learner process does not hold
    store = SharedWeights(policy.model, opt, params=trained)
    replica = HFCausalPolicy.from_name(cfg.model, dtype=cfg.dtype, replica=True, lora=lora)
    block = store.attach(replica.model, params=trainable_parameters(replica.model))
    publish = []
    for version in range(1, 6):
        t0 = time.perf_counter()
        store.begin_write()
        store.publish(version)
        store.load_into(block)
        publish.append(time.perf_counter() - t0)
    out.put({"update_s": times[1], "state": state, "rss": rss, "rss_now": rss_now, "publish_bytes": store.nbytes,
             "publish_load_s": median(publish), "trainable": sum(p.numel() for _, p in trained)})


def _kick(policy) -> None:
    """Adapters as after training: B != 0 (the cost does not depend on the values)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, p in trainable_parameters(policy.model):
            p.copy_(torch.randn(p.shape, generator=g) * 0.01)


class _MergedFromPristine:
    """A worker that merges: every adapted weight kept pristine, restored and merged again at each publish."""

    def __init__(self, policy):
        from peft.tuners.lora import LoraLayer

        self.layers = [m for m in policy.model.modules() if isinstance(m, LoraLayer)]
        self.pristine = [m.get_base_layer().weight.detach().clone() for m in self.layers]
        self.nbytes = sum(t.numel() * t.element_size() for t in self.pristine)

    @torch.no_grad()
    def merge(self) -> float:
        """Restore the base from pristine and add scale x B @ A; peft's forward then skips the adapters."""
        t0 = time.perf_counter()
        for m, w0 in zip(self.layers, self.pristine):
            w = m.get_base_layer().weight
            w.copy_(w0)
            w.add_(m.get_delta_weight("default").to(w.dtype))
            m.merged_adapters = ["default"]
        return time.perf_counter() - t0

    @torch.no_grad()
    def unmerge(self) -> None:
        for m, w0 in zip(self.layers, self.pristine):
            m.get_base_layer().weight.copy_(w0)
            m.merged_adapters = []


def _tokens_per_s(policy, prompts: list[list[int]], new_tokens: int) -> float:
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True)
    t0 = time.perf_counter()
    gens = policy.generate([[]] * len(prompts), prompts, params)
    return sum(len(g.response_ids) for g in gens) / (time.perf_counter() - t0)


def _decode_main(cfg: TrainConfig, prompts: list[list[int]], new_tokens: int, rounds: int, out) -> None:
    """Decode speed of the three ways, interleaved round by round in one process (so load from other
    processes on the machine falls on all three alike): the plain model, adapters unmerged, merged."""
    _start(cfg)
    plain = HFCausalPolicy.from_name(cfg.model, dtype=cfg.dtype, replica=True)
    adapted = HFCausalPolicy.from_name(cfg.model, dtype=cfg.dtype, replica=True, lora=lora_spec(cfg))
    _kick(adapted)
    merged = _MergedFromPristine(adapted)
    warm = SamplingParams(max_new_tokens=4, ignore_eos=True)
    for policy in (plain, adapted):
        policy.generate([[]] * 2, prompts[:2], warm)
    rates = {"plain": [], "unmerged": [], "merged": []}
    merges = []
    for _ in range(rounds):
        rates["plain"].append(_tokens_per_s(plain, prompts, new_tokens))
        rates["unmerged"].append(_tokens_per_s(adapted, prompts, new_tokens))
        merges.append(merged.merge())
        rates["merged"].append(_tokens_per_s(adapted, prompts, new_tokens))
        merged.unmerge()
    out.put({"tokens_per_s": {k: median(v) for k, v in rates.items()}, "merge_s": median(merges),
             "pristine_bytes": merged.nbytes})


def _worker_main(cfg: TrainConfig, variant: str, prompts: list[list[int]], new_tokens: int, out) -> None:
    """One worker replica decoding `prompts` once, for its peak RSS: the plain model, adapters unmerged, or
    merged from pristine (the pristine copy held)."""
    _start(cfg)
    lora = None if variant == "plain" else lora_spec(cfg)
    policy = HFCausalPolicy.from_name(cfg.model, dtype=cfg.dtype, replica=True, lora=lora)
    if lora is not None:
        _kick(policy)
    if variant == "merged":
        holder = _MergedFromPristine(policy)
        holder.merge()
    rate = _tokens_per_s(policy, prompts, new_tokens)
    out.put({"tokens_per_s": rate, "rss": peak_rss_bytes(), "rss_now": rss_now_bytes()})


def _batch(b: LoraBenchConfig) -> tuple[list, list[list[int]]]:
    """The update's episodes (from the base model) and the decode prompts."""
    torch.set_num_threads(b.threads)
    policy = HFCausalPolicy.from_name(_model(b), dtype=b.dtype, replica=True)
    tasks = load_tasks(task_specs(TrainConfig())[0], limit=max(b.tasks, b.decode_rows))
    engine = RolloutEngine(policy, sampling=SamplingParams(max_new_tokens=b.new_tokens, temperature=1.0), max_turns=2)
    results = engine.run(tasks[:b.tasks], num_samples=b.samples, seed=1).results
    for i, r in enumerate(results):
        r.trajectory.final_reward = float(i % 2)
    prompts = [policy.first_prompt_ids([{"role": "user", "content": t["question"]}]) for t in tasks[:b.decode_rows]]
    return results, prompts


def run_lora_bench(b: LoraBenchConfig) -> int:
    if b.quick:
        b.tasks, b.samples, b.new_tokens, b.decode_rows, b.rounds = 2, 2, 8, 8, 1
    t_start = time.perf_counter()
    print(f"[bench] LoRA rank {b.rank} vs full fine-tune on {_model(b)} ({b.dtype}) ...", flush=True)
    results, prompts = _batch(b)
    modes = [m.strip() for m in b.modes.split(",") if m.strip()]
    learners = {}
    for mode in modes:
        print(f"[bench] learner: {mode} ...", flush=True)
        learners[mode] = spawned_answer(_learner_main, [(_cfg(b, mode), results)])
    workers = {}
    for variant in ("plain", "unmerged", "merged"):
        print(f"[bench] worker memory: {variant} ...", flush=True)
        workers[variant] = spawned_answer(_worker_main, [(_cfg(b, "lora"), variant, prompts, b.new_tokens)])
    print(f"[bench] decode, {b.rounds} interleaved rounds ...", flush=True)
    decode = spawned_answer(_decode_main, [(_cfg(b, "lora"), prompts, b.new_tokens, b.rounds)])
    figures = {}
    for mode, got in learners.items():
        figures.update({f"_{mode}_{k}": v for k, v in got.items() if k != "state"})
        figures.update({f"_{mode}_{k}_bytes": v for k, v in got["state"].items()})
        figures[f"_{mode}_state_bytes"] = sum(got["state"].values())
    if {"full", "lora"} <= set(learners):
        full, lora = learners["full"], learners["lora"]
        figures["learner_state_ratio"] = sum(lora["state"].values()) / sum(full["state"].values())
        figures["learner_rss_ratio"] = lora["rss"] / full["rss"]
        figures["learner_rss_now_ratio"] = lora["rss_now"] / full["rss_now"]
        figures["publish_bytes_ratio"] = lora["publish_bytes"] / full["publish_bytes"]
        figures["publish_load_ratio"] = lora["publish_load_s"] / full["publish_load_s"]
        figures["update_time_ratio"] = lora["update_s"] / full["update_s"]
    rates = decode["tokens_per_s"]
    figures["decode_unmerged_vs_base"] = rates["unmerged"] / rates["plain"]
    figures["decode_merged_vs_base"] = rates["merged"] / rates["plain"]
    figures["merge_s"] = decode["merge_s"]
    figures["pristine_bytes"] = decode["pristine_bytes"]
    for variant, rate in rates.items():
        figures[f"_decode_{variant}_tokens_per_s"] = rate
    for variant, got in workers.items():
        figures[f"_worker_{variant}_rss"] = got["rss"]
        figures[f"_worker_{variant}_rss_now"] = got["rss_now"]
        figures[f"_worker_{variant}_once_tokens_per_s"] = got["tokens_per_s"]
    figures["_update_episodes"] = len(results)
    print(f"\n{'figure':34s} {'value':>14s}")
    for k, v in figures.items():
        print(f"{k:34s} {v:14.4g}")
    record_run(figures, t_start, b.json, quick=b.quick, model=_model(b), rank=b.rank, dtype=b.dtype)
    return 0
