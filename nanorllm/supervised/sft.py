"""Supervised fine-tuning (launch/sft.py): conversations -> the RL learner's update with a cross-entropy loss.

    python launch/sft.py --model M --data rows.jsonl --out sft_model        # then: launch/train.py --model sft_model

The program (flags, checks, learner ranks) is run/sft_program.py; this is the training it runs.

Why the RL learner and not a second trainer: the rows are StepSamples rendered as rollouts are
(supervised/sft_data.py), so the update that trains a rollout batch trains them too, with the same
micro-batches, packing, precision, LoRA, grad checkpointing and non-finite guard (trainer/update.py); only
the micro-batch's loss differs: the mean negative log-likelihood of the trained tokens (`SFTLoss`, beside RL's
`PolicyLoss` in trainer/loss.py).

Steps: each optimizer step trains --rows-per-step conversations, drawn in a fresh seeded order each epoch
(--max-steps steps, or as many as --epochs passes make), at RL's learning-rate schedule (--lr-schedule,
--warmup-steps; trainer/schedule.py) over the run's steps;
the step alone says which rows it trains, and no update draws a random number, so a resumed run (the
checkpoint's weights and AdamW state) continues exactly as an uninterrupted one. Checkpoints are the
training run's (trainer/checkpoint.py, `<run>/checkpoints/step_<N>/`), and so are the sinks
(--report-to: TensorBoard, metrics.jsonl, wandb). The model goes to --out in HF format, LoRA merged,
so `launch/train.py --model OUT` starts from it.
"""

import json
import math
import random
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from nanorllm.config.sft import SFTConfig
from nanorllm.config.specs import lora_spec
from nanorllm.core.types import StepSample
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.policy.lora import save_merged
from nanorllm.ranks.group import LearnerRanks
from nanorllm.ranks.split import split_conversations
from nanorllm.trainer import checkpoint
from nanorllm.trainer.collate import collate_train_batch
from nanorllm.trainer.loss import SFTLoss, token_logprobs
from nanorllm.trainer.precision import matmul_precision
from nanorllm.trainer.run_folder import InRunFolder, RunFolder, run_name_now
from nanorllm.trainer.schedule import lr_at
from nanorllm.trainer.trainable import load_trainable
from nanorllm.trainer.update import make_optimizer, score, step_micro_batches, update
from nanorllm.utils.devices import configure_threads
from nanorllm.utils.files import write_folder_atomic

MARKER = "sft.json"
"""The file every model folder SFT writes holds (`sft_record`): what makes an --out folder this program's own."""


@dataclass
class SFTRun(InRunFolder):
    """What a run holds: its policy and optimizer, its rows (train and held out), its folder and sinks (`close`
    them when done: trainer/run_folder.py)."""

    cfg: SFTConfig
    policy: HFCausalPolicy
    optimizer: torch.optim.Optimizer
    train: list[list[StepSample]]
    held_out: list[list[StepSample]]
    folder: RunFolder  # locked; its sinks open

    @property
    def steps(self) -> int:
        """Optimizer steps: --max-steps when given (TRL's max_steps: it replaces --epochs), else as many as --epochs
        passes over the rows make."""
        return self.cfg.max_steps or math.ceil(self.cfg.epochs * len(self.train) / self.cfg.rows_per_step)

    def rows_of_step(self, step: int) -> list[list[StepSample]]:
        """The rows step `step` trains: positions step x k .. (step + 1) x k of the epochs' seeded orders, one after
        another (as many epochs as --max-steps takes; under --epochs the last step may be short)."""
        k, n = self.cfg.rows_per_step, len(self.train)
        positions = range(step * k, (step + 1) * k if self.cfg.max_steps else min((step + 1) * k, self.cfg.epochs * n))
        orders = {e: epoch_order(n, self.cfg.seed, e) for e in {p // n for p in positions}}
        return [self.train[orders[p // n][p % n]] for p in positions]


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The rows' order in `epoch`: a shuffle seeded by (seed, epoch), so any step's rows are known without replay."""
    order = list(range(n))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def split_rows(rows: list, eval_frac: float, seed: int) -> tuple[list, list]:
    """(train, held out): a seeded `eval_frac` share held out (at least one row when the share is > 0)."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    n = min(len(rows) - 1, max(1, round(eval_frac * len(rows)))) if eval_frac > 0 else 0
    held = set(order[:n])
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]


def held_out_loss(run: SFTRun, ranks: LearnerRanks) -> float:
    """Mean negative log-likelihood per trained token of the held-out rows (no grad, the learner's passes), the
    rows split over the learner ranks as a step's are."""
    shares = split_conversations(run.held_out, ranks.world)
    if ranks.world == 1:
        return held_out_part(shares, run.cfg, run.policy, run.optimizer, ranks)
    return ranks.together(partial(held_out_part, shares, run.cfg), run.policy, run.optimizer)


def held_out_part(shares: list, cfg: SFTConfig, policy: HFCausalPolicy, optimizer, ranks: LearnerRanks) -> float:
    """Every rank, together: the loss of its share of the held-out rows, summed over the ranks (under FSDP a rank
    with fewer passes joins the others' forwards with empty ones)."""
    samples = [s for row in shares[ranks.rank] for s in row]
    chunks = step_micro_batches(policy, samples, cfg) if samples else []
    passes = int(ranks.all_max(len(chunks))) if ranks.world > 1 and ranks.parallel == "fsdp" else len(chunks)
    total = tokens = 0.0
    with torch.no_grad():
        for i in range(passes):
            if i >= len(chunks):
                ranks.idle_forward(policy)
                continue
            batch = collate_train_batch(chunks[i], pad_id=policy.pad_id, device=policy.device, pack=cfg.packing)
            logp, _ = token_logprobs(score(policy, batch).logits, batch["targets"])
            total, tokens = total - float(logp.sum()), tokens + logp.numel()
    ranks.reshard(policy)
    sums = ranks.all_sum({"nll": total, "tokens": tokens})
    return sums["nll"] / max(sums["tokens"], 1)


def step_lr(cfg: SFTConfig, step: int, steps: int) -> float:
    """The rate of 0-based `step` of a run of `steps`: RL's schedule (trainer/schedule.py), --warmup-steps, then
    --lr-schedule's decay to 0 at the run's last step."""
    return lr_at(step, lr=cfg.lr, schedule=cfg.lr_schedule, warmup_steps=cfg.warmup_steps, max_steps=steps)


def train_rows(policy: HFCausalPolicy, optimizer, rows: list[list[StepSample]], cfg: SFTConfig,
               ranks: LearnerRanks, *, lr: float) -> dict[str, float]:
    """One optimizer step at rate `lr` on this rank's `rows`, with the others' (update's sums are every rank's)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    samples = [s for row in rows for s in row]
    with matmul_precision(policy.device, tf32=cfg.tf32):  # as RL's update: TF32 on CUDA (--tf32)
        return update(policy, optimizer, samples, cfg, ranks=ranks, loss=SFTLoss(), host={})


def train_sft(run: SFTRun, start: int = 0, say=print, ranks: LearnerRanks | None = None) -> dict:
    """Steps `start` .. run.steps: update, log, checkpoint; then the held-out loss and the model at --out. With
    several learner `ranks` (rank 0 runs this; the others `run/sft_program.py follow_sft`) each step's rows are split over
    them by tokens (ranks/split.py), and the held-out loss too."""
    cfg, ranks = run.cfg, ranks or LearnerRanks(device=str(run.policy.device))
    last: dict = {}
    if run.held_out and start == 0:
        run.logger.scalars({"sft/eval_loss": held_out_loss(run, ranks)}, 0)
    for step in range(start, run.steps):
        t0 = time.perf_counter()
        with ranks.guarded():  # a rank that died or hangs: one RankError naming it
            ranks.begin(step)
            rows = ranks.share(run.rows_of_step(step), step, split=split_conversations)  # this rank's share
            lr = step_lr(cfg, step, run.steps)
            n = train_rows(run.policy, run.optimizer, rows, cfg, ranks, lr=lr)
        seconds = time.perf_counter() - t0
        last = {"sft/loss": n["loss"], "sft/assistant_tokens": n["tokens"], "sft/tokens_per_s": n["tokens"] / seconds,
                "sft/lr": lr, "sft/grad_norm": n["grad_norm"], "sft/skipped_nan": n["skipped_nan"],
                "sft/entropy": n["entropy"] / max(n["tokens"], 1), "perf/pad_frac": 1 - n["real_tokens"] /
                max(n["padded_tokens"], 1)}
        run.policy.version = step + 1
        if run.held_out and cfg.eval_every and (step + 1) % cfg.eval_every == 0:
            last["sft/eval_loss"] = held_out_loss(run, ranks)
        run.logger.scalars(last, step + 1)
        say(f"step {step + 1}/{run.steps} | loss {n['loss']:.4f} | {last['sft/tokens_per_s']:.0f} tokens/s")
        if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < run.steps:
            save_checkpoint(run, step + 1, ranks)
    if run.held_out:
        last["sft/eval_loss"] = held_out_loss(run, ranks)
        run.logger.scalars({"sft/eval_loss": last["sft/eval_loss"]}, run.steps)
    save_checkpoint(run, run.steps, ranks)
    write_model(run.policy, Path(cfg.out), sft_record(cfg, run.steps))
    run.logger.flush()
    return last


def save_checkpoint(run: SFTRun, step: int, ranks: LearnerRanks) -> Path:
    """The training run's checkpoint: weights (LoRA: the adapter), AdamW state (under FSDP gathered from the ranks'
    shards), the step; the data's position is the step's (`rows_of_step`)."""
    return checkpoint.save(run.run_dir, step, config=run.cfg.saved(), keep=run.cfg.keep_checkpoints,
                           policy=run.policy, optimizer_state=ranks.optimizer_state(run.policy, run.optimizer),
                           stream_position=step * run.cfg.rows_per_step, stream_origin=0,
                           task_order={"rows": len(run.train), "seed": run.cfg.seed}, totals={})


def write_model(policy: HFCausalPolicy, out: Path, record: dict) -> None:
    """The model at `out` in HF format (LoRA: merged into the base, so transformers alone loads it) with `record` as
    its sft.json, written beside and swapped in once whole and synced (utils/files.py): a model already at `out`
    stays until then."""
    def write(tmp: Path) -> None:
        if policy.peft is not None:
            save_merged(policy.model, policy.tokenizer, tmp)
        else:
            policy.save(str(tmp))
        (tmp / MARKER).write_text(json.dumps(record, indent=2) + "\n")

    write_folder_atomic(out, write)


def sft_record(cfg: SFTConfig, steps: int) -> dict:
    """sft.json: what the model was fine-tuned from and on, and the first prompt it learned to answer, which RL
    compares with its own (run/warm_start.py). Rows from --data carry their own prompts:
    their shape is the rows' own system message (the one they share; "" when none has one; None with
    system_prompts_differ when they differ) and no worked example."""
    if cfg.demos:
        source = {"demos": cfg.demos, "env": cfg.env}
        shape = {"system_prompt": cfg.system_prompt, "worked_example": cfg.worked_example,
                 "system_prompts_differ": False}
    else:
        source, system = {"data": cfg.data}, rows_system_prompt(cfg)
        shape = {"system_prompt": system, "worked_example": False, "system_prompts_differ": system is None}
    return {"program": "sft", "base_model": cfg.model, **source, "tools": cfg.tools, "steps": steps, "prompt": shape}


def rows_system_prompt(cfg: SFTConfig) -> str | None:
    """The system message every --data row opens with ("" when none opens with one); None when they differ."""
    from nanorllm.supervised.sft_data import read_rows, sft_columns

    column = sft_columns(cfg.task_fields)["messages"]
    found = set()
    for _, row in read_rows(cfg.data, limit=cfg.limit):
        messages = row.get(column)
        first = messages[0] if isinstance(messages, list) and messages and isinstance(messages[0], dict) else {}
        found.add(first.get("content") if first.get("role") == "system" else "")
    return found.pop() if len(found) == 1 and isinstance(next(iter(found)), str) else None


def learner_device(devices: str) -> str:
    """--devices' first entry; auto: the first GPU, else the CPU."""
    if devices == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    return devices.split(",")[0].strip()


def start_run(cfg: SFTConfig, rows_for, say=print, *, device: str | None = None, processes: int = 1
              ) -> tuple[SFTRun, int]:
    """Open the run folder (trainer/run_folder.py: locked; on --resume its newest checkpoint), load the policy on
    `device` (default: --devices' first) from it, render the rows (`rows_for(policy)`), open the sinks; returns the
    run and the step it starts at. `processes`: the learner ranks sharing this machine's cores. A failure on the way
    (bad rows) leaves a new run's folder as it found it."""
    device = device or learner_device(cfg.devices)
    configure_threads(device, cfg.threads, processes)
    torch.manual_seed(cfg.seed)
    folder = RunFolder.open(cfg.output_dir, cfg.run_name, resume=cfg.resume or None, say=say,
                            default_name=run_name_now(cfg.exp_name, cfg.seed))
    try:
        policy = load_trainable(cfg, device=device, lora=lora_spec(cfg), resumed=folder.resumed_model)
        train, held_out = split_rows(rows_for(policy), cfg.eval_frac, cfg.seed)
        optimizer = make_optimizer(policy, cfg)
        if folder.state:
            optimizer.load_state_dict(folder.state["optimizer"])
            torch.set_rng_state(folder.state["rng"]["torch"])
            policy.version = folder.start_step
        folder.write_config(cfg.saved())
        folder.open_sinks(cfg.report_to, cfg.saved())
    except BaseException:
        folder.close()
        raise
    say(f"[sft] {len(train)} rows ({len(held_out)} held out), run folder {folder.path}")
    return SFTRun(cfg, policy, optimizer, train, held_out, folder), folder.start_step


def sft_rows(cfg: SFTConfig, policy: HFCausalPolicy) -> list[list[StepSample]]:
    """--data's rows (or --demos N of --env's gold) rendered for `policy`'s template (--tools' schemas where a
    row has none)."""
    from nanorllm.envs.tools import load_tools
    from nanorllm.supervised.demos import demonstration_rows
    from nanorllm.supervised.sft_data import load_sft_rows

    tools = [t.schema for t in load_tools(cfg.tools)] if cfg.tools else None
    if cfg.demos:
        return demonstration_rows(cfg, policy, tools)
    context = cfg.max_tokens or policy.model.config.max_position_embeddings
    return load_sft_rows(cfg.data, policy.tokenizer, policy.eos_ids, task_fields=cfg.task_fields, tools=tools,
                         max_tokens=context, whole=cfg.sft_loss == "all", limit=cfg.limit)
