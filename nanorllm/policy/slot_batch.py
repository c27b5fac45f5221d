"""SlotBatch: the in-flight decode engine over a SlotCache (rows join and leave between steps).

It keeps the DecodeBatch's contract (join / step / cache_prefix, a state handed back for the next
turn, the same counters) but, in steady state, nothing moves in memory once a row has joined:
- a row owns a slot; its tokens sit at the columns of their positions, so joining, leaving and
  other rows' lengths never touch its keys and values;
- a finished turn hands back a SlotState, a handle on the slot: the episode's next turn takes the slot
  over and prefills only its new tokens; `release(state)` frees the slot of an episode that ended;
- a shared prompt prefix (`cache_prefix`) lives in a slot of its own; a row joining from it gets a
  fresh slot with the prefix's columns copied in;
- joiners prefill eagerly in one batched forward (left-padded; padding writes to the scratch slot);
- at a rollout's tail, rows left in high slots move down when that shrinks the rows a step
  computes (`_compact`): once per slot-range bucket under CUDA graphs, at every hole eager;
- each decode step is one function: forward the rows' last tokens, sample the next ones on the
  device (policy/sampler.py), and the host reads tokens, logprobs and end-of-turn flags in one copy.
  The step's row i is slot i: it runs over the slots [0, n) and reads their columns [0, context
  bucket) in place (policy/slot_cache.py); a slot in that range with no live row writes only to
  scratch. On CUDA that function is replayed from a CUDA graph per (slot-range bucket, context
  bucket) (policy/decode_graphs.py); on CPU it runs as is over n = the highest live slot + 1 and
  exactly the columns used, with each row's own torch.Generator, so a fixed seed samples what the
  DecodeBatch samples.
"""

from dataclasses import dataclass, field

import torch

from nanorllm.policy.base import Generation, SamplingParams
from nanorllm.policy.sampler import counter_uniforms, row_seed, sample_with_uniforms, uniforms_from_generators
from nanorllm.policy.slot_cache import MIN_CONTEXT, SlotCache, SlotForward, context_bucket, slot_range


def new_stats() -> dict:
    """Counters of what the model computed for one engine call."""
    return {"decode_steps": 0, "decode_rows": 0, "tokens_kept": 0,
            "prefill_tokens": 0, "reused_tokens": 0, "prefills": 0,
            "graph_steps": 0,  # decode steps replayed from a CUDA graph (policy/decode_graphs.py)
            "slot_moves": 0,  # rows moved to a lower slot at a rollout's tail (SlotBatch._compact)
            "computed_rows": 0,  # rows the decode steps computed, idle slots included (SlotBatch)
            "attended_columns": 0}  # columns the decode steps read, summed over steps (SlotBatch)


@dataclass
class SlotState:
    """A finished turn's tokens, still held in its slot for the episode's next turn."""

    token_ids: list[int]
    slot: int
    shared: bool = False  # a prompt prefix rows copy from, never taken over
    held: bool = True  # False once a row took the slot over or it was released


@dataclass
class _Row:
    key: object
    prompt_ids: list[int]
    rng: torch.Generator | None
    slot: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    @property
    def pos(self) -> int:
        """Position (= column) of the row's next input token: its last sampled one."""
        return len(self.prompt_ids) + len(self.tokens) - 1


class SlotBatch:
    """Rows sampling together over `cache`. Run under torch.no_grad and the policy's autocast
    (`HFCausalPolicy.decode_batch` does both). `graphs` (CUDA only) replays the decode step."""

    def __init__(self, policy, params: SamplingParams, *, cache: SlotCache, keep_state: bool = True,
                 stats: dict | None = None, graphs=None):
        self.policy, self.params, self.cache, self.keep_state = policy, params, cache, keep_state
        self.stats = stats if stats is not None else new_stats()
        self.graphs = graphs
        # the smallest context bucket a step reads; None: buckets of MIN_CONTEXT under graphs (a graph
        # per bucket), the exact columns used when eager (on CPU a padded column is compute)
        self.min_context: int | None = None
        self.device = cache.device
        self.counter_rng = self.device.type == "cuda"  # see policy/sampler.py
        self.eos = torch.tensor(policy.eos_ids, device=self.device)
        self.rows: list[_Row] = []
        self.fresh: list[torch.Tensor] = []  # prefill logits of the last rows that joined, not yet sampled
        self.n_fresh = 0
        self.next: tuple[torch.Tensor, torch.Tensor] | None = None  # the other rows' next tokens, logprobs
        self.states: list[SlotState] = []  # every state handed out: none outlives the batch

    def __len__(self) -> int:
        return len(self.rows)

    # ---- joining ---------------------------------------------------------------------------
    def join(self, entries: list[tuple[object, list[int], torch.Generator | None, SlotState | None]]) -> None:
        """Add rows (key, prompt_ids, rng, state). A row whose state holds a prefix of its prompt
        prefills only the rest (in the state's slot, or in a copy of a shared prefix's); all joiners
        prefill in one forward."""
        if not entries:
            return
        items, copies = [], {}
        for key, prompt, rng, state in entries:
            n = len(state.token_ids) if state is not None else 0
            if 0 < n < len(prompt) and prompt[:n] == state.token_ids and state.held:
                if state.shared:
                    slot = self.cache.take()
                    copies.setdefault(state.slot, (n, []))[1].append(slot)
                else:
                    slot, state.held = state.slot, False
            else:
                if state is not None:
                    self.release(state)
                slot, n = self.cache.take(), 0
            items.append((_Row(key, prompt, rng, slot), n))
        for source, (n, targets) in copies.items():
            self.cache.copy_prefix(source, targets, n)
        self.fresh.append(self._prefill([(row.slot, row.prompt_ids, n) for row, n in items]))
        self.rows += [row for row, _ in items]
        self.n_fresh += len(items)
        self.stats["prefills"] += len(entries)
        self.stats["reused_tokens"] += sum(n for _, n in items)

    def cache_prefix(self, ids: list[int]) -> SlotState:
        """A slot holding `ids` alone, for rows whose prompts start with them to join from."""
        slot = self.cache.take()
        self._prefill([(slot, ids, 0)])
        state = SlotState(token_ids=list(ids), slot=slot, shared=True)
        self.states.append(state)
        return state

    def release(self, state: SlotState | None) -> None:
        """The episode holding `state` ended: its slot is free for another."""
        if state is not None and state.held and not state.shared:
            state.held = False
            self.cache.give_back(state.slot)

    def close(self) -> None:
        """Every slot back to the cache, whatever was not released; a state kept past the batch no
        longer holds its slot (joining another batch with it prefills the whole prompt)."""
        for state in self.states:
            state.held = False
        self.cache.free = list(range(self.cache.slots - 1, -1, -1))
        self.rows, self.fresh, self.next = [], [], None

    def _prefill(self, items: list[tuple[int, list[int], int]]) -> torch.Tensor:
        """(slot, prompt, n cached) -> (b, V) logits after each prompt; writes prompt[n:] at columns n...
        Left padding: every row's last token is at the last column; padding goes to the scratch slot."""
        pad, scratch = self.policy.pad_id, self.cache.scratch
        rests = [(slot, prompt[n:], n) for slot, prompt, n in items]
        T = prefill_length(max(len(r) for _, r, _ in rests), self.device)
        ids = torch.full((len(rests), T), pad, dtype=torch.long)
        pos = torch.zeros((len(rests), T), dtype=torch.long)
        where = torch.full((len(rests), T), scratch, dtype=torch.long)
        for i, (slot, rest, n) in enumerate(rests):
            m = len(rest)
            ids[i, T - m:] = torch.tensor(rest)
            pos[i, T - m:] = torch.arange(n, n + m)
            where[i, T - m:] = slot
        width = max(n + len(r) for _, r, n in rests)
        self.cache.ensure_width(width + 1)  # and a column for the first decode step
        fwd = SlotForward(read_slots=torch.tensor([s for s, _, _ in rests], device=self.device),
                          write_slots=where.to(self.device), positions=pos.to(self.device), width=width)
        self.stats["prefill_tokens"] += sum(len(r) for _, r, _ in rests)
        return self.policy.slot_forward(ids.to(self.device), fwd, self.cache)

    # ---- one step ----------------------------------------------------------------------------
    def step(self) -> list[tuple[object, Generation, SlotState | None]]:
        """Every row gets one token; rows that finished leave (key, Generation, SlotState); the rest
        run one decode step, which samples their next tokens."""
        toks, lps = [], []
        if self.next is not None:
            toks.append(self.next[0])
            lps.append(self.next[1])
        if self.n_fresh:
            fresh = self.rows[len(self.rows) - self.n_fresh:]
            logits = torch.cat(self.fresh).float()  # (b, V)
            t, lp = sample_with_uniforms(logits, self.params, self._uniforms(fresh, [r.pos + 1 for r in fresh]))
            toks.append(t)
            lps.append(lp)
        tok, lp = torch.cat(toks), torch.cat(lps)  # (B,)
        end = torch.isin(tok, self.eos) & (not self.params.ignore_eos)
        host = torch.stack([tok.double(), lp.double(), end.double()], 1).tolist()  # the step's one copy to the host
        done, keep = [], []
        for i, (row, (t, p, e)) in enumerate(zip(self.rows, host)):
            row.tokens.append(int(t))
            row.logprobs.append(p)
            if e or len(row.tokens) >= self.params.max_new_tokens:
                done.append((row.key, self._generation(row), self._finish(row)))
            else:
                keep.append(i)
        self.stats["tokens_kept"] += len(self.rows)
        self.fresh, self.n_fresh, self.next = [], 0, None
        if len(keep) < len(self.rows):
            self.rows = [self.rows[i] for i in keep]
            tok = tok[torch.tensor(keep, dtype=torch.long, device=self.device)]
        if self.rows:
            self.next = self._decode(tok)
            self.stats["decode_steps"] += 1
            self.stats["decode_rows"] += len(self.rows)
        return done

    def _decode(self, tok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed each row its last token (B,); (B,) next tokens and logprobs."""
        self._compact()
        pos = [r.pos for r in self.rows]
        self.cache.ensure_width(max(pos) + 2)
        slots = [r.slot for r in self.rows]
        width = self.context_width(max(pos) + 1)
        self.stats["attended_columns"] += width
        if self.graphs is not None:
            out = self.graphs.run(self, tok, pos, slots, width)
            if out is not None:
                return out
        n, at = max(slots) + 1, torch.tensor(slots, device=self.device)
        self.stats["computed_rows"] += n
        tok_n, pos_n, write = self.slot_inputs(n, at, tok, torch.tensor(pos, device=self.device))
        u = self._uniforms(self.rows, [p + 1 for p in pos])
        if u is not None:
            u = torch.full((n,), 0.5, device=self.device).index_copy_(0, at, u)
        t, lp = self.decode_step(tok_n, pos_n, write, width, lambda: u)
        return t[at], lp[at]

    def _compact(self) -> None:
        """Move rows down when that shrinks the rows a step computes. At a rollout's tail rows finish
        and none join, so the last rows can sit in high slots above free ones, and every step runs
        the slots up to them, mostly idle. When moving the highest rows into the lowest free slots
        lets the step run fewer rows (`step_rows`: a smaller slot-range bucket under CUDA graphs, a
        lower top slot eager), they move: a copy of the columns each has written. Slots held by
        episodes between turns and shared prefixes stay where they are; while rows join, they take
        the lowest free slots and nothing moves."""
        top = max(r.slot for r in self.rows) + 1
        now = self.step_rows(top)
        if self.step_rows(len(self.rows)) == now:
            return  # the live rows alone need this many
        live, free = {r.slot for r in self.rows}, set(self.cache.free)
        held = [s for s in range(top) if s not in live and s not in free]
        target = self.step_rows(max(len(live) + len(held), max(held, default=-1) + 1))
        if target == now:
            return
        for row in sorted(self.rows, key=lambda r: r.slot, reverse=True):
            if row.slot < target:
                break
            slot = self.cache.take()  # the lowest free slot: below target
            self.cache.copy_prefix(row.slot, [slot], row.pos)  # columns [0, pos) are written; pos is fed next
            self.cache.give_back(row.slot)
            row.slot = slot
            self.stats["slot_moves"] += 1

    def step_rows(self, top: int) -> int:
        """Rows a decode step computes when its highest live slot is top - 1: the slot-range bucket
        under CUDA graphs (one graph each), exactly `top` eager (on CPU an idle row is compute)."""
        return slot_range(top, self.cache.slots) if self.graphs is not None else top

    def context_width(self, columns: int) -> int:
        """Columns a decode step attends over when the longest live row needs `columns`."""
        minimum = self.min_context or (MIN_CONTEXT if self.graphs is not None else None)
        return columns if minimum is None else context_bucket(columns, self.cache.width, minimum)

    def slot_inputs(self, n: int, at: torch.Tensor, tok: torch.Tensor,
                    pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A step over slots [0, n) from the live rows' tokens and positions at slots `at`: (n,) tokens,
        positions (0 for idle slots) and write slots (the scratch slot for idle ones)."""
        write = torch.full((n,), self.cache.scratch, dtype=torch.long, device=self.device).index_copy_(0, at, at)
        return (torch.zeros(n, dtype=torch.long, device=self.device).index_copy_(0, at, tok),
                torch.zeros(n, dtype=torch.long, device=self.device).index_copy_(0, at, pos), write)

    def decode_step(self, tok: torch.Tensor, pos: torch.Tensor, write: torch.Tensor, width: int,
                    uniforms) -> tuple[torch.Tensor, torch.Tensor]:
        """The step a CUDA graph captures: row i is slot i; forward tok (n,) at pos (n,), writing each
        row's keys/values into slot write[i] (i, or scratch for an idle slot), attending over columns
        [0, width) of slots [0, n) in place, then sample with `uniforms()` (n,). Fixed shapes in and out."""
        fwd = SlotForward(read_slots=None, write_slots=write[:, None], positions=pos[:, None], width=width)
        logits = self.policy.slot_forward(tok[:, None], fwd, self.cache).float()  # (n, V)
        return sample_with_uniforms(logits, self.params, uniforms())

    def _uniforms(self, rows: list[_Row], positions: list[int]) -> torch.Tensor | None:
        """One uniform per row for the tokens sampled at `positions` (None when greedy)."""
        if self.params.greedy:
            return None
        if not self.counter_rng:
            return uniforms_from_generators([r.rng for r in rows], self.device)
        seeds = torch.tensor([row_seed(r.rng) for r in rows], device=self.device)
        return counter_uniforms(seeds, torch.tensor(positions, device=self.device))

    def _finish(self, row: _Row) -> SlotState | None:
        if not self.keep_state:
            self.cache.give_back(row.slot)
            return None
        state = SlotState(token_ids=row.prompt_ids + row.tokens[:-1], slot=row.slot)  # the last token was never fed
        self.states.append(state)
        return state

    def _generation(self, row: _Row) -> Generation:
        truncated = row.tokens[-1] not in self.policy.eos_ids and not self.params.ignore_eos
        text = self.policy.tokenizer.decode(row.tokens, skip_special_tokens=True)
        return Generation(text=text, response_ids=row.tokens, logprobs=row.logprobs, truncated=truncated)


def prefill_length(n: int, device: torch.device) -> int:
    """Columns of a prefill: exact on CPU (padding is compute), a multiple of 32 on CUDA (few shapes)."""
    return n if device.type != "cuda" else -(-n // 32) * 32
