"""StaticDecodeBatch: the DecodeBatch with fixed-shape decode steps, for torch.compile and CUDA graphs.

The DecodeBatch grows its cache by one column a step and rebuilds it (cat, index) whenever a row
joins or leaves, so every step has a new shape: a compiled graph would recompile, a CUDA graph
could not replay. Here each layer's keys and values live in a preallocated (S, H, W, D) buffer,
transformers' StaticLayer: S slots, W columns. Every slot writes the same column `col` each step
(StaticLayer's shared write position, its `cumulative_length`), so the layout is the DecodeBatch's:
a row's tokens are the columns its mask marks, ending at column col - 1, with padding (mask 0)
before them or between a cached part and what it prefilled on joining, and, after col, columns
the causal mask hides. Rows occupy slots:
- a leaving row frees its slot (its mask row is zeroed);
- a joining row is prefilled as before (eager, a DynamicCache) and copied into a free slot, its
  tokens ending at col - 1;
- when no slot is free, a joiner holds more tokens than col, col reaches W, or the live rows would
  fit half the slots, the live rows are repacked (eager) into a new buffer. S and W are powers of
  two, so the compiled step sees few shapes (each shape is one CUDA graph).

A free slot still computes: it attends to the column it writes, so no attention row is all masked
(softmax would give NaN there, and a NaN key left in a slot would poison its next row: 0 x NaN is NaN).

Only the one-token decode forward is compiled (HFCausalPolicy.cached_forward(compiled=True)).
Sampling, stop rules and the KV states handed back are the DecodeBatch's, so a row samples the same
tokens from logits equal to float rounding: the compiled kernels, and softmax over W columns
instead of the used ones, add in another order.
"""

import torch
from transformers.cache_utils import Cache, StaticLayer

from nanorllm.policy.decode_batch import DecodeBatch, _Row


def bucket(n: int, least: int) -> int:
    """The smallest power of two >= max(n, least)."""
    return 1 << (max(n, least) - 1).bit_length()


class StaticDecodeBatch(DecodeBatch):
    """A DecodeBatch whose decode steps run one compiled, fixed-shape forward. The cache, mask and
    positions are per slot: cache layers (S, H, W, D), attn (S, W), pos (S,); logits stay per row."""

    MIN_SLOTS = 2  # a size-1 dimension would be one more compiled shape
    MIN_WIDTH = 64

    def __init__(self, policy, params, *, keep_state: bool = True, stats: dict | None = None):
        super().__init__(policy, params, keep_state=keep_state, stats=stats)
        self.slots: list[int] = []  # the slot of each row
        self.col = 0  # the column every slot writes next (each layer's cumulative_length too)

    @property
    def num_slots(self) -> int:
        return 0 if self.attn is None else self.attn.shape[0]

    def _merge(self, cache, attn: torch.Tensor, pos: torch.Tensor, logits: torch.Tensor, rows: list[_Row]) -> None:
        """Copy prefilled rows (cache layers (b, H, l, D), attn (b, l)) into free slots, ending at col - 1."""
        b, l = attn.shape
        self._fit(len(self.rows) + b, l, like=cache)
        taken = set(self.slots)
        free = [s for s in range(self.num_slots) if s not in taken][:b]
        idx = torch.tensor(free, device=self.attn.device)
        cols = slice(self.col - l, self.col)
        for mine, theirs in zip(self.cache.layers, cache.layers):
            mine.keys[idx, :, cols] = theirs.keys
            mine.values[idx, :, cols] = theirs.values
        self.attn[idx] = 0
        self.attn[idx, cols] = attn
        self.pos[idx] = pos
        self.logits = logits if not self.rows else torch.cat([self.logits, logits])
        self.rows += rows
        self.slots += free

    def _fit(self, n_rows: int, n_cols: int, *, like) -> None:
        """Repack unless n_rows rows fit the slots (and more than half of them: free slots still
        compute), n_cols tokens fit before col, and col has a column to write."""
        slots = bucket(n_rows, self.MIN_SLOTS)
        if (self.cache is None or slots > self.num_slots or 2 * slots <= self.num_slots
                or n_cols > self.col or self.col >= self.attn.shape[1]):
            self._repack(slots, n_cols, like)

    def _repack(self, slots: int, n_cols: int, like) -> None:
        """New buffers of `slots` slots; the live rows move to the first slots, their used columns
        to end at the new col - 1 (at least n_cols), with room after it for a whole response."""
        source = self.cache if self.cache is not None else like  # `like` gives the first buffers their shapes
        dev = source.layers[0].keys.device
        live = torch.tensor(self.slots, dtype=torch.long, device=dev)
        used = self.attn[live, :self.col].any(0) if self.rows else torch.zeros(0, dtype=torch.bool)
        start = int(used.int().argmax()) if used.any() else self.col  # first column a live row uses
        n = self.col - start
        col = max(n, n_cols)
        width = bucket(col + self.params.max_new_tokens, self.MIN_WIDTH)
        layers = []
        for old in source.layers:
            k, v = old.keys, old.values
            layer = StaticLayer(max_cache_len=width)
            layer.lazy_initialization(k.new_empty(slots, k.shape[1], 0, k.shape[3]),
                                      v.new_empty(slots, v.shape[1], 0, v.shape[3]))
            if n:
                layer.keys[:len(live), :, col - n:col] = k[live, :, start:self.col]
                layer.values[:len(live), :, col - n:col] = v[live, :, start:self.col]
            layer.cumulative_length.fill_(col)
            layers.append(layer)
        attn = torch.zeros((slots, width), dtype=torch.long, device=dev)
        pos = torch.zeros(slots, dtype=torch.long, device=dev)
        if self.rows:
            attn[:len(live), col - n:col] = self.attn[live, start:self.col]
            pos[:len(live)] = self.pos[live]
        self.cache, self.attn, self.pos, self.col = Cache(layers=layers), attn, pos, col
        self.slots = list(range(len(live)))
        self.stats["repacks"] += 1

    def _decode(self, tok: torch.Tensor) -> torch.Tensor:
        self._fit(len(self.rows), 0, like=self.cache)
        idx = torch.tensor(self.slots, device=self.attn.device)
        ids = torch.full((self.num_slots, 1), self.policy.pad_id, dtype=torch.long, device=self.attn.device)
        ids[idx, 0] = tok
        self.attn[:, self.col] = 1  # every slot, free ones too: see the module docstring
        logits = self.policy.cached_forward(ids, self.attn, self.pos[:, None], self.cache, compiled=True)  # (S, V)
        self.col += 1
        self.pos += 1
        return logits[idx]

    def _cache_row(self, i: int) -> int:
        return self.slots[i]

    def _select(self, keep: list[int]) -> None:
        """Keep these rows; the others' slots are free (mask zeroed). The buffers stay for later joiners."""
        kept = set(keep)
        gone = [s for i, s in enumerate(self.slots) if i not in kept]
        if gone:
            self.attn[torch.tensor(gone, device=self.attn.device)] = 0
        self.rows = [self.rows[i] for i in keep]
        self.slots = [self.slots[i] for i in keep]
        self.logits = self.logits[torch.tensor(keep, dtype=torch.long, device=self.logits.device)] if keep else None
