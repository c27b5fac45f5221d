"""DecodeGraphs: the SlotBatch's decode step replayed from CUDA graphs, one per (slot-range, context) bucket.

An eager decode step of a small model is ~1,000 kernel launches whose sum of work is far below what
the launches cost. A CUDA graph records them once and replays them in one call. A graph is fixed:
the same tensors, shapes and sampling parameters every replay. So:
- a step's row i is slot i (policy/slot_cache.py): the graph of slot-range bucket n (8, 16, 32, ...,
  capped at the slot count) runs slots [0, n) and reads their keys and values in place. Its static
  inputs (last tokens, positions, write slots, row seeds) and outputs (next tokens, logprobs) have n
  entries; a live row fills its slot's entry, an idle slot (free, a shared prefix, an episode
  between turns) sits at position 0 and writes to the scratch slot, so replay never touches it;
- attention reads columns [0, context bucket): powers of two from 128 to the cache's width
  (`context_buckets`), the first that covers the longest live row; a row that outgrows its bucket
  moves the step to the next bucket's graph, a row past the width grows the cache (below);
- weights are read where they are: a reload copies into the parameters (pipeline/weights.py), it never
  rebinds them, so the graphs see new weights with no recapture;
- a cache that grows (more slots or columns: policy/slot_cache.py) makes the graphs stale, and so do
  parameters that move to new memory (the learner's, flattened into the shared weight block after its
  startup parity check captured graphs: `flatten_parameters`): both are part of the key (`layout`),
  and the next step recaptures (one line on the console);
- sampling parameters are part of the key: greedy evaluation and the training temperature each get
  their own graphs, captured on first use;
- if a capture fails, the engine says so in one line and runs eager from then on (`perf/graphs` 0).
All graphs share one memory pool and are captured largest first (as nano-vllm does): slot-range
buckets x context buckets per sampling setting: 4 x 3 = 12 for the default run (33 slots x 384
columns), 7 x 3 = 21 at 256 episodes a step; greedy evaluation's are captured on first use.
"""

import sys
import time

import torch

from nanorllm.policy.sampler import counter_uniforms, row_seed
from nanorllm.policy.slot_cache import MIN_CONTEXT, context_buckets, slot_ranges


class StepGraph:
    """One captured decode step over n slots: its static inputs, the CUDA graph, its outputs."""

    def __init__(self, n: int, device: torch.device):
        self.n = n
        self.tok = torch.zeros(n, dtype=torch.long, device=device)
        self.pos = torch.zeros(n, dtype=torch.long, device=device)
        self.write = torch.zeros(n, dtype=torch.long, device=device)
        self.seeds = torch.zeros(n, dtype=torch.long, device=device)
        self.out: tuple[torch.Tensor, torch.Tensor] | None = None
        self.graph = None

    def capture(self, step, pool) -> None:
        """Warm `step` up on a side stream made on the step's device (lazy inits and autotuning stay
        outside), then record it on that same stream. Not torch.cuda.graph's own capture stream: that
        one is made once per process on whichever device was current, and a policy on cuda:N that
        never became the current device would capture on cuda:0's stream (and fall back to eager)."""
        device = self.tok.device
        with torch.cuda.device(device):
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    step()
            torch.cuda.current_stream(device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=pool, stream=side):
                self.out = step()
            torch.cuda.synchronize(device)

    def replay(self) -> None:
        self.graph.replay()


class DecodeGraphs:
    """Captured decode steps keyed by (slot range, context, sampling params, memory layout)."""

    graph_type = StepGraph  # what records and replays a step (tests swap in an eager stand-in on CPU)

    def __init__(self, on_progress=None):
        self.graphs: dict[tuple, StepGraph] = {}
        self.pool = None
        self.failed: str | None = None  # why capture failed; eager from then on
        self.capture_s = 0.0
        self.on_progress = on_progress or (lambda: None)  # a heartbeat between captures

    def run(self, batch, tok: torch.Tensor, pos: list[int], slots: list[int], width: int):
        """Replay the step for the batch's rows (tokens, positions, slots) over columns [0, width);
        (next tokens, logprobs) of the rows, or None to run eager."""
        if self.failed or not slots:
            return None
        key = (batch.step_rows(max(slots) + 1), width, params_key(batch.params),
               layout(batch.cache, batch.policy.model))
        g = self.graphs.get(key)
        if g is None:
            self._drop_stale(key[3])
            g = self._capture(batch, key)
            if g is None:
                return None
        # the rows' slots, positions and sampler seeds reach the device in one copy
        host = torch.tensor([slots, pos, [row_seed(r.rng) for r in batch.rows]])
        at, p, seeds = host.to(batch.device, non_blocking=True)
        g.pos.zero_()
        g.write.fill_(batch.cache.scratch)
        g.tok.index_copy_(0, at, tok)
        g.pos.index_copy_(0, at, p)
        g.write.index_copy_(0, at, at)
        g.seeds.index_copy_(0, at, seeds)
        g.replay()
        batch.stats["graph_steps"] += 1
        batch.stats["computed_rows"] += g.n
        return g.out[0][at], g.out[1][at]

    def capture_all(self, batch) -> float:
        """Capture every (slot-range, context) bucket of the batch's cache for its sampling params,
        largest first (a graph needed later is captured on first use); seconds taken."""
        for size in reversed(slot_ranges(batch.cache.slots)):
            for width in reversed(context_buckets(batch.cache.width, batch.min_context or MIN_CONTEXT)):
                key = (size, width, params_key(batch.params), layout(batch.cache, batch.policy.model))
                if key not in self.graphs and self._capture(batch, key) is None:
                    return self.capture_s
                self.on_progress()
        return self.capture_s

    def _capture(self, batch, key: tuple) -> StepGraph | None:
        size, width = key[0], key[1]
        t0 = time.perf_counter()
        try:
            g = self.graph_type(size, batch.device)
            g.write.fill_(batch.cache.scratch)  # warm-up and capture write to scratch only
            greedy = batch.params.greedy

            def step():
                u = None if greedy else counter_uniforms(g.seeds, g.pos + 1)
                return batch.decode_step(g.tok, g.pos, g.write, width, lambda: u)

            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle() if batch.device.type == "cuda" else None
            with _no_autocast_cache(batch.policy):
                g.capture(step, self.pool)
        except Exception as e:  # noqa: BLE001 -- any failure means: run eager
            self.failed = f"{type(e).__name__}: {e}"
            print(f"[engine] WARNING: CUDA graph capture failed ({self.failed.splitlines()[0][:200]}); "
                  "decoding eagerly (perf/graphs 0)", file=sys.stderr, flush=True)
            self.graphs.clear()
            return None
        self.graphs[key] = g
        self.capture_s += time.perf_counter() - t0
        return g

    def _drop_stale(self, current: tuple) -> None:
        stale = [k for k in self.graphs if k[3] != current]
        if stale:
            print(f"[engine] the slot cache grew or the weights moved: recapturing {len(stale)} decode graph(s)",
                  flush=True)
        for k in stale:
            del self.graphs[k]


def layout(cache, model: torch.nn.Module) -> tuple[int, int]:
    """The memory a captured step reads: the cache's buffers (their version) and the parameters' storage
    (the first one's address: rebinding, as `flatten_parameters` does, moves every parameter)."""
    return cache.version, next(model.parameters()).data_ptr()


def params_key(params) -> tuple:
    """What of the sampling settings a captured step has baked in."""
    return (params.greedy, params.temperature, params.top_p)


def _no_autocast_cache(policy):
    """Autocast's cache of cast weights must not live inside a graph: capture with it off."""
    if policy.compute_dtype is None:
        import contextlib

        return contextlib.nullcontext()
    return torch.autocast(policy.device.type, dtype=policy.compute_dtype, cache_enabled=False)
