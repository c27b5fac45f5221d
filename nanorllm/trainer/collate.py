"""collate_train_batch: StepSamples (plain lists) -> padded or packed tensors for one forward pass.

Turns of one episode are merged into one sequence when each turn's prompt extends the previous
turn's prompt + response token for token (HFCausalPolicy builds prompts that way), so one forward
scores every turn and the shared history is computed once.

Besides the (B, T) tensors the batch carries a flat view of the N scored tokens, which is what the
loss uses: `positions[i] = (b, t - 1)` is where the logits predicting `targets[i] = input_ids[b, t]`
come from. And `shared_columns` (policy/shared_columns.py): how many leading columns every row
shares, which the forward would otherwise have to read from the device, counted here from the lists
the batch is built from.

Packed (`pack=True`): the merged rows are laid end to end in rows as wide as the longest (first fit,
longest first, as TRL's best-fit packing), and `position_ids` restart at 0 at each row's first token;
the forward builds from them an attention that never crosses rows (HFCausalPolicy.forward), so every
token sees what it sees in its padded row and its logprob is the same. The only pad left is each
packed row's tail (its own sequence, never scored). Why rows of the longest width and not one row of
all: SDPA computes a masked attention whole, so one row of L tokens would cost L^2 where the padded
rows cost B x T^2 at most; a packed row of width T costs what one padded row does. The flat view
(positions, targets, ...) lists the same tokens in the same order as the padded one: the loss reads
nothing else and is the same too. A packed pass shares no prompt template between rows
(shared_columns is 0). Where no packed row would hold two sequences (rows of similar length: the
micro-batches come sorted by length) the padded layout is the packed one, and the batch is the padded
batch: its attention needs no mask beyond the causal one, and the shared template stays.
"""

from dataclasses import dataclass, field

import torch

from nanorllm.core.types import StepSample
from nanorllm.policy.shared_columns import shared_columns


@dataclass
class _Sequence:
    ids: list[int]
    spans: list[tuple[int, StepSample]] = field(default_factory=list)  # (response start, sample)


def _merge_turns(samples: list[StepSample]) -> list[_Sequence]:
    seqs: list[_Sequence] = []
    last_episode = None
    for s in samples:
        cur = seqs[-1] if seqs else None
        extends = (cur is not None and s.episode_id == last_episode
                   and len(s.prompt_ids) >= len(cur.ids) and s.prompt_ids[:len(cur.ids)] == cur.ids)
        if not extends:
            cur = _Sequence(ids=[])
            seqs.append(cur)
        cur.ids = list(s.prompt_ids)
        cur.spans.append((len(cur.ids), s))
        cur.ids += s.response_ids
        last_episode = s.episode_id
    return seqs


def _packed_places(lengths: list[int], width: int) -> tuple[list[int], list[int]]:
    """(packed row, column offset) of each sequence: first fit into rows of `width`, longest first."""
    free: list[int] = []  # columns left in each packed row
    rows, offsets = [0] * len(lengths), [0] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        b = next((b for b, f in enumerate(free) if f >= lengths[i]), len(free))
        if b == len(free):
            free.append(width)
        rows[i], offsets[i] = b, width - free[b]
        free[b] -= lengths[i]
    return rows, offsets


def collate_train_batch(samples: list[StepSample], *, pad_id: int, device: str | torch.device = "cpu",
                        pack: bool = False) -> dict:
    """Pad merged sequences on the right, or pack them into as few rows. Loss mask is 1 exactly on sampled
    (response) tokens.

    input_ids, attention_mask, loss_mask: (B, T); packed, (R, T) with position_ids (R, T), R <= B
    positions: (N, 2); targets, old_logprobs, advantages, sample_index, policy_version: (N,)
    shared_columns: int, the leading columns every row shares (HFCausalPolicy.forward's `shared`)
    """
    seqs = _merge_turns(samples)
    index_of = {id(s): i for i, s in enumerate(samples)}
    lengths = [len(s.ids) for s in seqs]
    T = max(lengths)
    places = _packed_places(lengths, T) if pack else None
    packed = places is not None and max(places[0]) + 1 < len(seqs)  # else no row fits two: the padded layout
    rows, offsets = places if packed else (list(range(len(seqs))), [0] * len(seqs))
    B = max(rows) + 1
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, T), dtype=torch.long)
    loss_mask = torch.zeros((B, T), dtype=torch.long)
    position_ids = torch.zeros((B, T), dtype=torch.long)
    positions, old_lp, adv, sample_index, versions = [], [], [], [], []
    for seq, b, o in zip(seqs, rows, offsets):
        input_ids[b, o:o + len(seq.ids)] = torch.tensor(seq.ids)
        attention_mask[b, o:o + len(seq.ids)] = 1
        position_ids[b, o:o + len(seq.ids)] = torch.arange(len(seq.ids))
        for start, s in seq.spans:
            k = len(s.response_ids)
            if start == 0 and k:
                raise ValueError(f"sample {s.episode_id} turn {s.turn} has an empty prompt: nothing predicts its first token")
            loss_mask[b, o + start:o + start + k] = 1
            positions += [(b, o + t - 1) for t in range(start, start + k)]
            old_lp += s.rollout_logprobs
            adv += [s.advantage] * k
            sample_index += [index_of[id(s)]] * k
            versions += [s.policy_version] * k
    positions_t = torch.tensor(positions, dtype=torch.long).reshape(-1, 2)
    batch = {
        "input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask,
        "positions": positions_t,
        "targets": input_ids[positions_t[:, 0], positions_t[:, 1] + 1],
        "old_logprobs": torch.tensor(old_lp, dtype=torch.float32),
        "advantages": torch.tensor(adv, dtype=torch.float32),
        "sample_index": torch.tensor(sample_index, dtype=torch.long),
        "policy_version": torch.tensor(versions, dtype=torch.long),  # the weights that sampled each token
        "num_samples": len(samples),
        "num_tokens": sum(lengths),  # real (unpadded) tokens of the rows
        "shared_columns": 0 if packed else shared_columns([seq.ids for seq in seqs],
                                                        min((t for _, t in positions), default=0)),
    }
    if packed:  # each sequence's own positions, from 0 (a tail's pads are one-token sequences): attention keeps within them
        batch["position_ids"] = position_ids
    if torch.device(device).type == "cuda":  # pinned and asynchronous: the copy does not wait for the device
        return {k: v.pin_memory().to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
