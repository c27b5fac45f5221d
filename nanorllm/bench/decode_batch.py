"""DecodeBatch: KV-cached sampling where rows join and leave between decode steps.

A fixed batch keeps computing a row that has finished until its longest row ends, and a new turn
has to wait for the next batch. Here a row leaves the batch the step it samples its end-of-turn token
(or its last allowed one), and a new row can join before any step: the engine puts an episode's next
turn in as soon as the env has answered the previous one.

The cache is one transformers DynamicCache whose layers hold (B, H, L, D) keys and values over L
common columns, with a (B, L) attention mask: a row's tokens are the columns its mask marks, in
order, ending at the right; padding (mask 0) lies before them or between its cached part and what it
prefilled on joining. Joining pads the shorter side on the left; leaving selects rows and then drops
leading columns that are padding in every row. Each row carries its own positions,
so left padding never shifts RoPE, and its own random stream (`rng`), so what it samples does not
depend on which other rows share its steps.

A row that finishes hands back its KV state (the keys/values of every token it has in the cache). Its
next turn's prompt extends that turn token for token, so joining again only prefills the new tokens
(the last sampled token, the end-of-turn marker, the env's feedback and the generation prompt).
A first turn joins the same way from `cache_prefix`: the chat template and worked example that
every episode's prompt starts with are computed once per batch.

It is no longer the training engine (that is the SlotBatch, policy/slot_batch.py): it is the
reference the slot engine is tested and benchmarked against. `ReferencePolicy(policy)` is the same
policy with this engine behind `decode_batch`, so a RolloutEngine runs on it unchanged.
"""

import contextlib
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from nanorllm.policy.base import Generation, SamplingParams
from nanorllm.policy.slot_batch import new_stats


@dataclass
class KVState:
    """What a finished row leaves in the cache: its tokens and their keys/values."""

    token_ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (1, H, len(token_ids), D) keys, values


@dataclass
class _Row:
    key: object  # the caller's handle
    prompt_ids: list[int]
    rng: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class DecodeBatch:
    """Rows sampling together. `policy` is an HFCausalPolicy; run it under torch.no_grad and the
    policy's autocast (`HFCausalPolicy.decode_batch` does both)."""

    def __init__(self, policy, params: SamplingParams, *, keep_state: bool = True, stats: dict | None = None):
        self.policy = policy
        self.params = params
        self.keep_state = keep_state  # hand finished rows' KV states back (for their next turn)
        self.stats = stats if stats is not None else new_stats()
        self.rows: list[_Row] = []
        self.cache: DynamicCache | None = None  # layers of (B, H, L, D)
        self.attn: torch.Tensor | None = None  # (B, L) 1 on a row's cached tokens
        self.pos: torch.Tensor | None = None  # (B,) position of each row's next input token
        self.logits: torch.Tensor | None = None  # (B, V) next-token logits of every row

    def __len__(self) -> int:
        return len(self.rows)

    # ---- joining ---------------------------------------------------------------------------
    def join(self, entries: list[tuple[object, list[int], torch.Generator | None, KVState | None]]) -> None:
        """Add rows (key, prompt_ids, rng, state). Rows whose `state` holds a prefix of their prompt
        prefill only the rest, reusing the state's keys/values; the others prefill whole. Each kind
        is one batched forward."""
        fresh, extending = [], []
        for key, prompt, rng, state in entries:
            n = len(state.token_ids) if state is not None else 0
            if 0 < n < len(prompt) and prompt[:n] == state.token_ids:
                extending.append((_Row(key, prompt, rng), state))
            else:
                fresh.append(_Row(key, prompt, rng))
        if extending:
            self._merge(*self._extend(extending), [row for row, _ in extending])
        if fresh:
            self._merge(*self._prefill([r.prompt_ids for r in fresh]), fresh)
        self.stats["prefills"] += len(entries)

    def cache_prefix(self, ids: list[int]) -> KVState:
        """The KV state of `ids` on their own, for rows whose prompts start with them to join from:
        a prompt template every episode shares is computed once, not once per row."""
        cache, *_ = self._prefill([ids])
        return KVState(token_ids=list(ids), layers=[(layer.keys, layer.values) for layer in cache.layers])

    def _prefill(self, prompts: list[list[int]]):
        dev, pad = self.policy.device, self.policy.pad_id
        B, T = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((B, T), pad, dtype=torch.long)
        attn = torch.zeros((B, T), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding: every row's last prompt token is at column T - 1
            ids[i, T - len(p):] = torch.tensor(p)
            attn[i, T - len(p):] = 1
        ids, attn = ids.to(dev), attn.to(dev)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # (B, T)
        cache = DynamicCache()
        logits = cached_forward(self.policy, ids, attn, pos, cache)  # (B, V)
        self.stats["prefill_tokens"] += sum(len(p) for p in prompts)
        return cache, attn, pos[:, -1] + 1, logits

    def _extend(self, rows: list[tuple[_Row, KVState]]):
        """One forward for rows that continue a cached state. A row's columns read
        [pad | its cached tokens | pad | its new tokens]: cached parts are left-padded to the longest
        state, new parts to the longest rest, and the mask hides both pads."""
        dev, pad = self.policy.device, self.policy.pad_id
        cached = [len(state.token_ids) for _, state in rows]
        rests = [row.prompt_ids[n:] for (row, _), n in zip(rows, cached)]
        B, N, M = len(rows), max(cached), max(len(r) for r in rests)
        ids = torch.full((B, M), pad, dtype=torch.long)
        attn = torch.zeros((B, N + M), dtype=torch.long)
        pos = torch.zeros((B, M), dtype=torch.long)
        for i, (n, rest) in enumerate(zip(cached, rests)):
            m = len(rest)
            ids[i, M - m:] = torch.tensor(rest)
            attn[i, N - n:N] = 1
            attn[i, N + M - m:] = 1
            pos[i] = (torch.arange(M) - (M - m)).clamp(min=0) + n  # padding queries get any valid position
        layers = [(torch.cat([_pad_left(state.layers[j][0], N, 2) for _, state in rows]),
                   torch.cat([_pad_left(state.layers[j][1], N, 2) for _, state in rows]))
                  for j in range(len(rows[0][1].layers))]
        cache = DynamicCache(ddp_cache_data=layers)
        ids, attn, pos = ids.to(dev), attn.to(dev), pos.to(dev)
        logits = cached_forward(self.policy, ids, attn, pos, cache)  # (B, V)
        self.stats["prefill_tokens"] += sum(len(r) for r in rests)
        self.stats["reused_tokens"] += sum(cached)
        return cache, attn, pos[:, -1] + 1, logits

    def _merge(self, cache: DynamicCache, attn: torch.Tensor, pos: torch.Tensor, logits: torch.Tensor,
               rows: list[_Row]) -> None:
        """Append rows (their cache, mask, next positions, logits) below the running ones."""
        if not self.rows:
            self.cache, self.attn, self.pos, self.logits, self.rows = cache, attn, pos, logits, rows
            return
        L, l = self.attn.shape[1], attn.shape[1]
        width = max(L, l)
        for mine, theirs in zip(self.cache.layers, cache.layers):
            mine.keys = torch.cat([_pad_left(mine.keys, width, 2), _pad_left(theirs.keys, width, 2)])
            mine.values = torch.cat([_pad_left(mine.values, width, 2), _pad_left(theirs.values, width, 2)])
        self.attn = torch.cat([_pad_left(self.attn, width, 1), _pad_left(attn, width, 1)])
        self.pos = torch.cat([self.pos, pos])
        self.logits = torch.cat([self.logits, logits])
        self.rows += rows

    # ---- one step ----------------------------------------------------------------------------
    def release(self, state: KVState | None) -> None:
        """An episode ended: its state holds no slot, the garbage collector frees its tensors."""

    def step(self) -> list[tuple[object, Generation, KVState | None]]:
        """Sample one token for every row; rows that finished leave (key, Generation, KVState);
        the rest run one forward for their next logits."""
        params, eos = self.params, self.policy.eos_ids
        tok, lp = self.policy.sample(self.logits.float(), params, [r.rng for r in self.rows])  # (B,), (B,)
        done, keep = [], []
        for i, (row, t, p) in enumerate(zip(self.rows, tok.tolist(), lp.tolist())):
            row.tokens.append(t)
            row.logprobs.append(p)
            if (t in eos and not params.ignore_eos) or len(row.tokens) >= params.max_new_tokens:
                done.append((row.key, self._generation(row), self._state(i, row) if self.keep_state else None))
            else:
                keep.append(i)
        self.stats["tokens_kept"] += len(self.rows)
        if len(keep) < len(self.rows):
            self._select(keep)
        if self.rows:
            self.logits = self._decode(tok[keep] if len(keep) < tok.shape[0] else tok)
            self.stats["decode_steps"] += 1
            self.stats["decode_rows"] += len(self.rows)
        return done

    def _decode(self, tok: torch.Tensor) -> torch.Tensor:
        """Feed each row its sampled token (B,); (B, V) next-token logits."""
        self.attn = torch.cat([self.attn, torch.ones_like(self.attn[:, :1])], dim=1)  # (B, L + 1)
        logits = cached_forward(self.policy, tok[:, None], self.attn, self.pos[:, None], self.cache)
        self.pos = self.pos + 1
        return logits

    def _generation(self, row: _Row) -> Generation:
        truncated = row.tokens[-1] not in self.policy.eos_ids and not self.params.ignore_eos
        text = self.policy.tokenizer.decode(row.tokens, skip_special_tokens=True)
        return Generation(text=text, response_ids=row.tokens, logprobs=row.logprobs, truncated=truncated)

    def _state(self, i: int, row: _Row) -> KVState:
        ids = row.prompt_ids + row.tokens[:-1]  # the last sampled token was never fed to the model
        cols = self.attn[i].nonzero().squeeze(1)  # the columns holding this row's tokens, in order
        assert len(cols) == len(ids), (len(cols), len(ids))
        layers = [(layer.keys[i:i + 1, :, cols], layer.values[i:i + 1, :, cols]) for layer in self.cache.layers]
        return KVState(token_ids=ids, layers=layers)

    def _select(self, keep: list[int]) -> None:
        """Keep these rows, then drop leading columns that are padding in all of them."""
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.cache = self.attn = self.pos = self.logits = None
            return
        idx = torch.tensor(keep, device=self.attn.device)
        attn = self.attn[idx]
        start = int(attn.any(0).int().argmax())  # first column some row uses
        self.attn = attn[:, start:]
        for layer in self.cache.layers:
            layer.keys = layer.keys[idx, :, start:]
            layer.values = layer.values[idx, :, start:]
        self.pos, self.logits = self.pos[idx], self.logits[idx]


def _pad_left(x: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """Zeros on the left of `dim` up to `width` (a mask's 0 = padding; padded keys are never attended)."""
    missing = width - x.shape[dim]
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x.new_zeros(shape), x], dim=dim)


def cached_forward(policy, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                   cache: DynamicCache) -> torch.Tensor:
    """(B, V) next-token logits after `input_ids` (B, T); `cache` (its keys/values for the first
    L columns of the (B, L + T) `attention_mask`) is extended in place."""
    out = policy.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       use_cache=True, logits_to_keep=1, **{policy._cache_kw: cache})
    return out.logits[:, -1]


class ReferencePolicy:
    """An HFCausalPolicy whose `decode_batch` is a DecodeBatch; every other attribute is the policy's."""

    def __init__(self, policy):
        self.__dict__["policy"] = policy

    def __getattr__(self, name: str):
        return getattr(self.policy, name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self.policy, name, value)

    @contextlib.contextmanager
    def decode_batch(self, params: SamplingParams, *, keep_state: bool = True, stats: dict | None = None,
                     slots: int = 0, width: int = 0):
        """HFCausalPolicy.decode_batch's contract (eval mode, no grad, the policy's autocast); the slot
        sizes mean nothing here."""
        policy = self.policy
        was_training = policy.model.training
        policy.model.eval()
        try:
            with torch.no_grad(), policy.autocast():
                yield DecodeBatch(policy, params, keep_state=keep_state, stats=stats)
        finally:
            policy.model.train(was_training)
