"""collate_train_batch: StepSamples (plain lists) -> padded tensors for one forward pass.

Turns of one episode are merged into one sequence when each turn's prompt extends the previous
turn's prompt + response token for token (HFCausalPolicy builds prompts that way), so one forward
scores every turn and the shared history is computed once.

Besides the (B, T) tensors the batch carries a flat view of the N scored tokens, which is what the
loss uses: `positions[i] = (b, t - 1)` is where the logits predicting `targets[i] = input_ids[b, t]`
come from. And `shared_columns` (policy/shared_columns.py): how many leading columns every row
shares, which the forward would otherwise have to read from the device, counted here from the lists
the batch is built from.
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


def collate_train_batch(samples: list[StepSample], *, pad_id: int, device: str | torch.device = "cpu") -> dict:
    """Pad merged sequences on the right. Loss mask is 1 exactly on sampled (response) tokens.

    input_ids, attention_mask, loss_mask: (B, T)
    positions: (N, 2); targets, old_logprobs, advantages, sample_index, policy_version: (N,)
    shared_columns: int, the leading columns every row shares (HFCausalPolicy.forward's `shared`)
    """
    seqs = _merge_turns(samples)
    index_of = {id(s): i for i, s in enumerate(samples)}
    B, T = len(seqs), max(len(s.ids) for s in seqs)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, T), dtype=torch.long)
    loss_mask = torch.zeros((B, T), dtype=torch.long)
    positions, old_lp, adv, sample_index, versions = [], [], [], [], []
    for b, seq in enumerate(seqs):
        input_ids[b, :len(seq.ids)] = torch.tensor(seq.ids)
        attention_mask[b, :len(seq.ids)] = 1
        for start, s in seq.spans:
            k = len(s.response_ids)
            if start == 0 and k:
                raise ValueError(f"sample {s.episode_id} turn {s.turn} has an empty prompt: nothing predicts its first token")
            loss_mask[b, start:start + k] = 1
            positions += [(b, t - 1) for t in range(start, start + k)]
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
        "num_tokens": sum(len(seq.ids) for seq in seqs),  # real (unpadded) tokens of the rows
        "shared_columns": shared_columns([seq.ids for seq in seqs], min((t for _, t in positions), default=0)),
    }
    if torch.device(device).type == "cuda":  # pinned and asynchronous: the copy does not wait for the device
        return {k: v.pin_memory().to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
