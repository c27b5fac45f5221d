"""Fitting a reward model (launch/train_reward_model.py): a causal LM's body with a 1-logit sequence-classification
head, fitted on labelled rows (BCE) or preference pairs (Bradley-Terry), saved as a folder --reward-model loads.

A plain loop, not TRL's RewardTrainer: that trainer covers preference pairs only (the labelled rows the policy's
own samples give would need a second path), and it brings the Trainer/accelerate machinery for what the RL
learner's parts already do here: its passes (trainer/micro_batches.py), precision (trainer/precision.py),
checkpoints (trainer/checkpoint.py) and sinks (utils/logger.py). Scores are computed exactly as the reward model
computes them when it scores (rewards/model.py: the same rendering, left cut and head), so what is fitted is what
is served. Its config: config/fit.py.
"""

import contextlib
import itertools
import json
import math
import random
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from nanorllm.config.fit import FitConfig
from nanorllm.rewards.model import batch_tensors, encode, head_scores, pad_id
from nanorllm.supervised.data import RewardDataError, pairs_from_labelled, read_rows
from nanorllm.trainer import checkpoint
from nanorllm.trainer.micro_batches import device_max_pad_frac, device_micro_batch_tokens, length_chunks
from nanorllm.trainer.precision import matmul_precision
from nanorllm.trainer.run_folder import InRunFolder, RunFolder, run_name_now
from nanorllm.utils.devices import configure_threads
from nanorllm.utils.files import write_atomic, write_folder_atomic
from nanorllm.utils.outputs import OutputPath, output_problems
from nanorllm.utils.precision import resolve as resolve_precision


class FitError(RuntimeError):
    """A fit whose model cannot be saved (its weights went non-finite)."""


def out_problems(cfg: FitConfig) -> list[str]:
    """Why --out may not be written (utils/outputs.py): fitting writes a folder marked by its fit.json; --sample-from
    and --to-pairs one JSONL file; --score writes nothing."""
    if cfg.score is not None:
        return []
    kind = "file" if cfg.sample_from is not None or cfg.to_pairs else "folder"
    return output_problems(OutputPath(cfg.out, kind, marker="fit.json"), cfg.overwrite)


def write_pairs(cfg: FitConfig, say=print) -> list[dict]:
    """--to-pairs: --data's labelled rows as pairs in --out (written whole or not at all)."""
    kind, rows = read_rows(cfg.data)
    if kind != "labelled":
        raise RewardDataError([f"{cfg.data}: --to-pairs reads labelled rows, these are {kind}"])
    pairs = pairs_from_labelled(rows, cfg.pairs_per_prompt)
    if not pairs:
        raise RewardDataError([f"{cfg.data}: no prompt has both a response labelled 1 and one labelled 0"])
    out = Path(cfg.out)
    write_atomic(out, "".join(json.dumps(x) + "\n" for x in pairs))
    say(f"[pairs] {len(pairs)} pairs from {len({json.dumps(x['prompt']) for x in pairs})} prompts "
        f"({len(rows)} labelled rows) | written to {out}")
    return pairs


def score_rows(cfg: FitConfig) -> dict:
    """--score: {"model", "data", "kind", "rows", "accuracy"} of the reward model folder cfg.score on cfg.data."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    kind, rows = read_rows(cfg.data)
    tokenizer = AutoTokenizer.from_pretrained(cfg.score, trust_remote_code=False)
    model = AutoModelForSequenceClassification.from_pretrained(cfg.score, trust_remote_code=False).eval()
    model.to(fit_device(cfg))
    return {"model": cfg.score, "data": cfg.data, "kind": kind, "rows": len(rows),
            "accuracy": accuracy(model, tokenizer, kind, rows, cfg)}


def load_classifier(name: str):
    """(sequence classifier with a fresh 1-logit head, tokenizer) from a causal LM name or folder."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from nanorllm.policy.models import SMOLLM2, TINY, ensure_smollm2, load_model_and_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        path = ensure_smollm2() if name == SMOLLM2 else name
        if name == TINY:  # built in memory: through a folder, as any causal LM is read
            model, tokenizer = load_model_and_tokenizer(TINY)
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            path = tmp
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, trust_remote_code=False)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    pad_id(model, tokenizer)
    return model, tokenizer


def encoded(tokenizer, kind: str, batch: list[dict], max_tokens: int) -> list[tuple[list[int], ...]]:
    """Each row's token ids as it is scored: (response,) or (chosen, rejected)."""
    texts = ("chosen", "rejected") if kind == "pairs" else ("response",)
    return [tuple(encode(tokenizer, r["prompt"], r[t], max_tokens) for t in texts) for r in batch]


def passes(rows: list[tuple[list[int], ...]], cfg: FitConfig, model) -> list[list[int]]:
    """The rows' indices in passes of at most --micro-batch-tokens padded tokens (a pair's two rows together),
    bucketed by --max-pad-frac as the learner's (trainer/micro_batches.py)."""
    from nanorllm.policy.hf_causal import DTYPES

    dtype = DTYPES[resolve_precision(cfg.dtype, str(model.device))]
    budget = device_micro_batch_tokens(model, model.device, dtype, cfg.micro_batch_tokens)
    return length_chunks([max(len(x) for x in r) for r in rows], budget, rows=len(rows[0]),
                         max_pad_frac=device_max_pad_frac(model.device, cfg.max_pad_frac))


def pass_loss_and_hits(model, kind: str, rows: list[tuple[list[int], ...]], labels: list[float]
                       ) -> tuple[torch.Tensor, int]:
    """(the summed loss of one pass's rows, rows scored right): BCE of each score against its label, or
    -log sigmoid(chosen - rejected) of each pair, a pair's two rows in one forward."""
    flat = [r[0] for r in rows] + [r[1] for r in rows if kind == "pairs"]
    ids, mask = batch_tensors(flat, model.config.pad_token_id, model.device)
    s = head_scores(model(input_ids=ids, attention_mask=mask).logits).float()
    if kind == "pairs":
        margin = s[:len(rows)] - s[len(rows):]
        return -F.logsigmoid(margin).sum(), int((margin > 0).sum())
    target = torch.tensor(labels, device=s.device)
    return F.binary_cross_entropy_with_logits(s, target, reduction="sum"), int(((s > 0).float() == target).sum())


def labels_of(kind: str, batch: list[dict]) -> list[float]:
    return [float(r["label"]) for r in batch] if kind == "labelled" else [1.0] * len(batch)


def accuracy(model, tokenizer, kind: str, rows: list[dict], cfg: FitConfig) -> float | None:
    """Rows scored right, as a share (None: no rows), computed in the fit's passes without gradients, in the
    weights' dtype, as --reward-model scores."""
    if not rows:
        return None
    ids, labels = encoded(tokenizer, kind, rows, cfg.max_tokens), labels_of(kind, rows)
    with torch.no_grad():
        hits = sum(pass_loss_and_hits(model, kind, [ids[i] for i in chunk], [labels[i] for i in chunk])[1]
                   for chunk in passes(ids, cfg, model))
    return hits / len(rows)


def train_step(model, optimizer, tokenizer, kind: str, batch: list[dict], cfg: FitConfig) -> float:
    """One optimizer step on `batch`: each pass's summed loss over the batch's rows backward (the gradient of the
    batch's mean loss, in as many passes as --micro-batch-tokens needs), clipped, stepped. Returns the mean loss."""
    ids, labels = encoded(tokenizer, kind, batch, cfg.max_tokens), labels_of(kind, batch)
    optimizer.zero_grad()
    total = 0.0
    with matmul_precision(model.device, tf32=cfg.tf32):
        for chunk in passes(ids, cfg, model):
            with compute_precision(cfg, str(model.device)):
                loss, _ = pass_loss_and_hits(model, kind, [ids[i] for i in chunk], [labels[i] for i in chunk])
            (loss / len(batch)).backward()
            total += loss.item()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    optimizer.step()
    return total / len(batch)


def save(model, tokenizer, summary: dict, folder: Path) -> None:
    """The reward model's folder: weights, tokenizer and fit.json (the summary), fit.json last."""
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "fit.json").write_text(json.dumps(summary, indent=2) + "\n")


def fit_device(cfg: FitConfig) -> str:
    """--devices' first entry (auto: the first GPU, else the CPU), with this process's CPU threads set."""
    from nanorllm.supervised.sft import learner_device

    device = learner_device(cfg.devices)
    configure_threads(device, cfg.threads, 1)
    return device


def compute_precision(cfg: FitConfig, device: str):
    """--dtype as the learner computes: bf16 autocast over fp32 weights, or nothing."""
    from nanorllm.policy.hf_causal import DTYPES

    dtype = DTYPES[resolve_precision(cfg.dtype, device)]
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


@dataclass
class Classifier:
    """The fitted model as a checkpoint saves a policy (trainer/checkpoint.py): the folder --reward-model loads
    under model/. A fit samples nothing: the generator whose state rng.pt keeps is a fresh one, never drawn from."""

    model: object
    tokenizer: object
    generator: torch.Generator = field(default_factory=torch.Generator)

    def save(self, folder: str) -> None:
        self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)


@dataclass
class FitRun(InRunFolder):
    """A fit's rows (shuffled, split), its model and optimizer, its run folder and sinks, and the steps so far."""

    cfg: FitConfig
    kind: str
    train: list[dict]
    held_out: list[dict]
    rng: random.Random  # the rows' order: shuffled by --seed, then again at each epoch
    model: object
    tokenizer: object
    optimizer: torch.optim.Optimizer
    folder: RunFolder  # locked; its sinks open
    losses: list[float]

    @property
    def steps(self) -> int:
        """Optimizer steps: --epochs passes of ceil(rows / --batch-size), capped by --max-steps (0: no cap)."""
        n = self.cfg.epochs * math.ceil(len(self.train) / self.cfg.batch_size)
        return min(n, self.cfg.max_steps) if self.cfg.max_steps else n

    def batches(self):
        """(epoch, rows) of every step from the first: each epoch reshuffles the rows with the run's rng, so the
        steps a resumed fit skips are replayed as shuffles alone and it continues on the rows it would have."""
        bs = self.cfg.batch_size
        for epoch in range(self.cfg.epochs):
            self.rng.shuffle(self.train)
            for i in range(0, len(self.train), bs):
                yield epoch, self.train[i:i + bs]


def start_fit(cfg: FitConfig, say=print) -> FitRun:
    """Read and split the rows, load the classifier on the fit's device (from the newest checkpoint under --resume,
    with its AdamW state, torch RNG and losses), make the run folder and its sinks."""
    kind, rows = read_rows(cfg.data)
    rng = random.Random(cfg.seed)
    rng.shuffle(rows)
    held = int(len(rows) * cfg.eval_frac)
    device = fit_device(cfg)
    torch.manual_seed(cfg.seed)
    folder = RunFolder.open(cfg.output_dir, cfg.run_name, resume=cfg.resume or None, say=say,
                            default_name=run_name_now(cfg.exp_name, cfg.seed))
    try:
        model, tokenizer = load_classifier(folder.resumed_model or cfg.model)
        model.to(device)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                                      weight_decay=cfg.weight_decay)
        if folder.state:
            optimizer.load_state_dict(folder.state["optimizer"])
            torch.set_rng_state(folder.state["rng"]["torch"])
        folder.write_config(asdict(cfg))
        folder.open_sinks(cfg.report_to, asdict(cfg))
    except BaseException:
        folder.close()
        raise
    say(f"[fit] {len(rows) - held} {kind} rows to fit, {held} held out on {device}, run folder {folder.path}")
    return FitRun(cfg, kind, rows[held:], rows[:held], rng, model, tokenizer, optimizer, folder,
                  list(folder.state["totals"]["losses"]) if folder.state else [])


def save_checkpoint(run: FitRun, step: int) -> Path:
    """The training run's checkpoint (trainer/checkpoint.py): the classifier, AdamW's state, the RNGs, the losses;
    the rows' position is the step's (FitRun.batches)."""
    return checkpoint.save(run.run_dir, step, config=asdict(run.cfg), keep=run.cfg.keep_checkpoints,
                           policy=Classifier(run.model, run.tokenizer), optimizer_state=run.optimizer.state_dict(),
                           stream_position=step * run.cfg.batch_size, stream_origin=0,
                           task_order={"rows": len(run.train), "seed": run.cfg.seed}, totals={"losses": run.losses})


def held_out_accuracy(run: FitRun, step: int) -> float | None:
    """The held-out rows' accuracy now, logged at `step` as fit/held_out_accuracy."""
    acc = accuracy(run.model.eval(), run.tokenizer, run.kind, run.held_out, run.cfg)
    if acc is not None:
        run.logger.scalars({"fit/held_out_accuracy": acc}, step)
    return acc


def fit(cfg: FitConfig, say=print) -> dict:
    """Fit on cfg.data, save to cfg.out (model, tokenizer, fit.json); the summary fit.json holds. The sinks are
    closed however it ends (a stopped fit's last complete step is in them; --resume cuts them back to its
    checkpoint)."""
    run = start_fit(cfg, say)
    try:
        return train_fit(run, say)
    finally:
        run.folder.close()


def train_fit(run: FitRun, say=print) -> dict:
    """Steps from the run's first not yet taken to the last, logged and checkpointed; then the held-out accuracy,
    the last checkpoint and the model at --out."""
    cfg = run.cfg
    start, per_epoch = len(run.losses), math.ceil(len(run.train) / cfg.batch_size)
    if start == 0:
        say(f"[fit] held-out accuracy before: {held_out_accuracy(run, 0)}")
    for step, (epoch, batch) in enumerate(itertools.islice(run.batches(), run.steps)):
        if step < start:
            continue
        run.model.train()
        run.losses.append(train_step(run.model, run.optimizer, run.tokenizer, run.kind, batch, cfg))
        run.logger.scalars({"fit/loss": run.losses[-1]}, step + 1)
        if (step + 1) % per_epoch == 0 or step + 1 == run.steps:
            epoch_losses = run.losses[epoch * per_epoch:]
            say(f"[fit] epoch {epoch + 1}/{cfg.epochs}: mean loss {sum(epoch_losses) / len(epoch_losses):.4f}")
        if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < run.steps:
            held_out_accuracy(run, step + 1)
        if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < run.steps:
            save_checkpoint(run, step + 1)
    model = run.model.eval()
    bad = [name for name, w in model.named_parameters() if not torch.isfinite(w).all()]
    if bad:
        raise FitError(f"the fit left {len(bad)} weights non-finite (first: {bad[0]}); nothing saved: lower --lr")
    summary = {"kind": run.kind, "train_rows": len(run.train), "held_out_rows": len(run.held_out),
               "losses": run.losses, "held_out_accuracy": held_out_accuracy(run, run.steps), "run_dir": str(run.run_dir)}
    save_checkpoint(run, run.steps)
    out = Path(cfg.out)
    write_folder_atomic(out, lambda tmp: save(model, run.tokenizer, summary, tmp))
    name = "pairwise accuracy" if run.kind == "pairs" else "accuracy"
    say(f"[fit] held-out {name}: {summary['held_out_accuracy']} | saved to {out} (--reward-model {out})")
    return summary
