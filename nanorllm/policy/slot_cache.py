"""SlotCache: one preallocated KV buffer per layer, a slot per episode, and the attention that reads it.

Each layer holds keys and values of shape (S + 1, kv_heads, W, head_dim) in the replica's compute
dtype. An episode owns a slot from its first turn to its end; column c of its slot holds its token
at position c, so a slot needs no mask of its own: a query at position p attends to columns <= p
(and, for a sliding-window layer, > p - window). Nothing is repacked in steady state: a finished
episode's slot is handed to the next one, whose writes overwrite the columns it will read (at a
rollout's tail a row may move to a lower slot: SlotBatch._compact). The last slot is
scratch: padding tokens and idle rows write there, never into a slot someone owns.

A decode step reads the cache in place: its row i IS slot i (`SlotForward.read_slots` None), so
attention reads the view `keys[:B, :, :width]`, never a copy. Slots are handed out lowest first, so
live rows sit in the lowest slots and B stays near the live count; a slot in [0, B) with no live
row (free, a shared prompt prefix, an episode between turns) is an idle row: it writes only to the
scratch slot and its output is dropped. `width` is a context bucket (`context_bucket`: a power of
two >= 128 covering the longest live row), not the cache's width, so short episodes read few columns.
A prefill (rows at arbitrary slots, many tokens) gathers its rows' slots (`read_slots`).

The model code stays transformers' own. For a forward over the cache the model's
`config._attn_implementation` is switched to SLOT_ATTENTION, a function registered with
transformers' AttentionInterface: it receives each layer's new keys/values (after RoPE), writes
them at their rows' columns and attends over the rows' slots with SDPA (GQA as query rows, without copies). A
layer that soft-caps its attention logits (Gemma2) gets the eager formula instead, as transformers
itself does, unless the model runs transformers' SDPA attention, which drops the soft-capping (some
transformers versions pick it for Gemma2): then neither does this, so the sampler computes the
function the learner's forward computes. The model's own `scaling`, `softcap` and `sliding_window`
come in as arguments, so a family's quirks stay its own. transformers builds no mask for a name its
mask registry does not know, so the step pays for none.
"""
import contextlib
import ctypes
import gc
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

SLOT_ATTENTION = "nanorllm_slots"


@dataclass
class SlotForward:
    """Where one forward's tokens go and which slots they read. Tensors on the cache's device."""

    read_slots: torch.Tensor | None  # (B,) the slot each row attends over; None: row i reads slot i in place
    write_slots: torch.Tensor  # (B, T) the slot each new token is written to (scratch for padding)
    positions: torch.Tensor  # (B, T) each token's position = its column (0 for padding)
    width: int  # columns attended: at least max(positions) + 1
    masks: dict = field(default_factory=dict)  # window -> mask, built once per forward

    def mask(self, window: int | None) -> torch.Tensor:
        """(B, 1, T, width) True where a query may attend."""
        if window not in self.masks:
            self.masks[window] = self._mask(window)
        return self.masks[window]

    def _mask(self, window: int | None) -> torch.Tensor:
        cols = torch.arange(self.width, device=self.positions.device)  # (W,)
        q = self.positions[:, None, :, None]  # (B, 1, T, 1)
        allowed = cols <= q
        if window is not None:
            allowed = allowed & (cols > q - window)
        return allowed


class SlotCache:
    """Per-layer (S + 1, H, W, D) key and value buffers and the bookkeeping of which slots are taken."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, *, slots: int, width: int,
                 dtype: torch.dtype, device: torch.device):
        self.slots, self.width, self.dtype, self.device = slots, width, dtype, torch.device(device)
        shape = (slots + 1, kv_heads, width, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.free = list(range(slots - 1, -1, -1))  # pop() hands out slot 0 first
        self.version = next(_LAYOUTS)  # new whenever buffers are allocated: graphs captured on others are stale
        self.forward: SlotForward | None = None  # set around a forward over the cache
        self.model_attention: str | None = None  # the model's own attention implementation, during that forward

    @property
    def scratch(self) -> int:
        return self.slots

    @property
    def nbytes(self) -> int:
        return 2 * sum(k.numel() * k.element_size() for k in self.keys)

    def take(self) -> int:
        if not self.free:
            self._grow(slots=2 * self.slots)
        return self.free.pop()

    def give_back(self, slot: int) -> None:
        assert slot not in self.free and 0 <= slot < self.slots, slot
        self.free.append(slot)
        self.free.sort(reverse=True)  # take() hands out the lowest: live rows stay in the lowest slots

    def ensure_width(self, columns: int) -> None:
        """Room for `columns` tokens in every slot: a longer episode widens every slot (a copy of every
        slot, none overwritten) to `columns` or a quarter more than now, whichever is wider, in 64s; it
        never writes past its slot's end. A quarter, not a doubling: a game's held-out eval whose rows ran
        past its 1,152 columns by a few hundred took 1.65 GB more at twice the width."""
        if columns > self.width:
            width = -(-max(columns, self.width * 5 // 4) // 64) * 64
            self._grow(width=width)

    def copy_prefix(self, source: int, targets: list[int], n: int) -> None:
        """The first n columns of slot `source` into each slot of `targets` (a shared prompt prefix)."""
        idx = torch.tensor(targets, device=self.device)
        for buf in (*self.keys, *self.values):
            buf[idx, :, :n] = buf[source, :, :n]

    def _grow(self, *, slots: int | None = None, width: int | None = None) -> None:
        old_slots, slots, width = self.slots, slots or self.slots, width or self.width
        for bufs in (self.keys, self.values):
            for i, old in enumerate(bufs):
                new = old.new_zeros((slots + 1, old.shape[1], width, old.shape[3]))
                new[:old_slots, :, :self.width] = old[:old_slots]
                bufs[i] = new
        self.free = list(range(slots - 1, old_slots - 1, -1)) + self.free
        self.slots, self.width = slots, width
        self.version = next(_LAYOUTS)

    @contextlib.contextmanager
    def attending(self, model, forward: SlotForward):
        """Run `model` over this cache: its attention layers call slot_attention with `forward`."""
        config = model.config
        previous = config._attn_implementation
        config._attn_implementation = SLOT_ATTENTION
        self.forward, self.model_attention, _ACTIVE[0] = forward, previous, self
        try:
            yield
        finally:
            config._attn_implementation = previous
            self.forward, self.model_attention, _ACTIVE[0] = None, None, None


MIN_CONTEXT = 128  # the smallest context bucket


def context_bucket(columns: int, width: int, minimum: int = MIN_CONTEXT) -> int:
    """Columns a decode step attends over: the first power of two >= `columns` (at least `minimum`),
    at most the cache's `width`. Few values, so a CUDA graph per bucket stays cheap to capture."""
    bucket = minimum
    while bucket < columns:
        bucket *= 2
    return min(bucket, width)


def context_buckets(width: int, minimum: int = MIN_CONTEXT) -> list[int]:
    """Every context bucket of a cache `width` columns wide, smallest first."""
    out = [min(minimum, width)]
    while out[-1] < width:
        out.append(min(out[-1] * 2, width))
    return out


MIN_BUCKET = 8  # the smallest slot-range bucket


def buckets(max_rows: int) -> list[int]:
    """8, 16, 32, ... up to the first power of two >= max_rows."""
    out = [MIN_BUCKET]
    while out[-1] < max_rows:
        out.append(out[-1] * 2)
    return out


def slot_ranges(slots: int) -> list[int]:
    """The slot-range buckets of a cache of `slots` slots: `buckets(slots)`, the last one capped at `slots`.
    A decode step runs over slots [0, n) for n one of these (one CUDA graph each)."""
    return [min(b, slots) for b in buckets(slots)]


def slot_range(top: int, slots: int) -> int:
    """The slot-range bucket a step over slots [0, top) runs at."""
    return next(n for n in slot_ranges(slots) if n >= top)


_LAYOUTS = itertools.count()
_ACTIVE: list[SlotCache | None] = [None]  # the cache a forward is running over (one per process)


def slot_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
                   dropout: float = 0.0, scaling: float | None = None, softcap: float | None = None,
                   sliding_window: int | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """query (B, Hq, T, D), key/value (B, Hkv, T, D) of the new tokens -> (B, T, Hq, D)."""
    cache = _ACTIVE[0]
    fwd = cache.forward
    layer = module.layer_idx
    k_buf, v_buf = cache.keys[layer], cache.values[layer]
    cols = fwd.positions
    k_buf[fwd.write_slots, :, cols] = key.transpose(1, 2).to(k_buf.dtype)  # (B, T, Hkv, D) into their columns
    v_buf[fwd.write_slots, :, cols] = value.transpose(1, 2).to(v_buf.dtype)
    B, Hq, T, D = query.shape
    if fwd.read_slots is None:  # a decode step: row i is slot i, read in place (a view, no copy)
        k, v = k_buf[:B, :, :fwd.width], v_buf[:B, :, :fwd.width]  # (B, Hkv, W, D)
    else:  # a prefill: its rows' slots gathered
        k = k_buf[:, :, :fwd.width].index_select(0, fwd.read_slots)
        v = v_buf[:, :, :fwd.width].index_select(0, fwd.read_slots)
    if cache.model_attention == "sdpa":
        softcap = None  # transformers' SDPA path drops soft-capping: the learner's forward computes without it
    # The query is cast to the cache's dtype, not the keys and values to the query's: under bf16 autocast over fp32
    # parameters RoPE hands over an fp32 query, and casting the attended K/V slice to it would copy
    # every column read, every layer, every step (autocast then casts it back for SDPA).
    query = query.to(k.dtype)
    mask = fwd.mask(sliding_window)  # (B, 1, T, W)
    groups = Hq // k.shape[1]
    if groups > 1 and (T == 1 or softcap is None):
        # a kv head's query heads become its query rows, (B, Hkv, groups * T, D): no copy of the keys,
        # and the masked memory-efficient/flash SDPA kernels take it where they refuse enable_gqa with a
        # mask (the math kernel would materialise (B, Hq, T, W) scores)
        query = query.reshape(B, k.shape[1], groups * T, D)
        W = mask.shape[-1]
        mask = mask.expand(B, 1, groups, W) if T == 1 else mask.expand(B, groups, T, W).reshape(B, 1, groups * T, W)
    elif groups > 1:
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)  # a soft-capped prefill
    if softcap is None:
        out = F.scaled_dot_product_attention(query, k, v, attn_mask=mask, scale=scaling)
    else:  # transformers' eager formula: SDPA has no soft-capping
        scores = torch.matmul(query, k.transpose(2, 3)) * (scaling if scaling is not None else D ** -0.5)
        scores = torch.tanh(scores / softcap) * softcap
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        out = torch.matmul(F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype), v)
    return out.reshape(B, Hq, -1, D).transpose(1, 2).contiguous(), None


AttentionInterface.register(SLOT_ATTENTION, slot_attention)


def model_shape(model) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a transformers causal LM."""
    c = model.config
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    return c.num_hidden_layers, getattr(c, "num_key_value_heads", None) or heads, head_dim


def cache_bytes(model, *, slots: int, width: int, dtype: torch.dtype) -> int:
    layers, kv_heads, head_dim = model_shape(model)
    return 2 * layers * (slots + 1) * kv_heads * width * head_dim * torch.tensor([], dtype=dtype).element_size()


def release_freed(device: torch.device) -> None:
    """Hand back to the system what this process freed but still holds: unreachable cycles, then
    CUDA's cached blocks or glibc's free heap pages. A second run in one process (a benchmark's
    table, a notebook) otherwise starts with the first's heap in its RSS, and MemAvailable cannot see
    that it is free: the memory plan refused a run for 0.5 GB with 5.7 GB of such pages held."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    else:
        trim_host_heap(device)


def trim_host_heap(device: torch.device | str | None) -> None:
    """Hand glibc's free heap pages back to the system when `device` computes on the host: a CPU (not a GPU's
    process, whose big tensors are not on the heap, nor a device-less policy; a no-op off glibc). A process
    whose big tensors change size from one round to the next (a learner's micro-batches as a game's rows grow,
    a worker's decode batch) leaves holes the next round's sizes do not fit, and its resident memory grows
    round by round: a TicTacToe learner that needs 7 GB at once stood at 18.8 GB after 8 updates. Called once
    a round, it costs the next round's first touch of those pages; forcing big blocks to mmap instead
    (MALLOC_MMAP_THRESHOLD_) cost the update 58% on CPU."""
    if _LIBC is not None and device is not None and torch.device(device).type == "cpu":
        _LIBC.malloc_trim(0)


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:  # not glibc (musl, macOS): nothing to trim
        return None


_LIBC = _glibc()


def free_memory(device: torch.device) -> int:
    """Bytes a new buffer may take on `device`: CUDA's free memory, or the host's available memory
    (host_memory), each after this process has handed back what it freed (`release_freed`)."""
    release_freed(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return host_memory()[0]


# Where the host's figures are read (a test points them at a fake folder).
MEMINFO, PROC_SELF_CGROUP, CGROUP_ROOT = "/proc/meminfo", "/proc/self/cgroup", "/sys/fs/cgroup"
UNKNOWN = 1 << 62  # nothing could be read: said so in the memory plan's table, never refused
NO_LIMIT = 1 << 60  # a cgroup v1 "unlimited" is 2^63 rounded down to a page


def host_memory() -> tuple[int, str]:
    """(bytes this process may still take on the host, where the figure comes from): the least of the
    machine's available memory and what this process's memory cgroups still allow (v2 memory.max, v1
    memory.limit_in_bytes, at its own cgroup and every one above it). A container limited to 8 GB on a 64 GB
    host is planned against 8 GB, not OOM-killed for 64. Available memory is MemAvailable, else (kernels
    before 3.14) MemFree + Buffers + Cached, else the free physical pages (sysconf)."""
    machine, source = _machine_available()
    limit = cgroup_free()
    if limit is not None and limit[0] < machine:
        return limit
    return machine, source


def _machine_available() -> tuple[int, str]:
    try:
        with open(MEMINFO) as f:
            info = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f if ":" in line)}
    except (OSError, ValueError, IndexError):
        info = {}
    if "MemAvailable" in info:
        return info["MemAvailable"], "MemAvailable"
    if "MemFree" in info:
        return info["MemFree"] + info.get("Buffers", 0) + info.get("Cached", 0), "MemFree + Buffers + Cached"
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free physical pages"
    except (ValueError, OSError, AttributeError):
        return UNKNOWN, "unknown"


def cgroup_free() -> tuple[int, str] | None:
    """(bytes the tightest memory cgroup of this process still allows: limit - usage + its inactive file
    pages, which the kernel reclaims before it kills, the file that sets that limit), or None without a limit."""
    try:
        with open(PROC_SELF_CGROUP) as f:
            lines = [line.strip().split(":", 2) for line in f if line.count(":") >= 2]
    except OSError:
        return None
    root, found = Path(CGROUP_ROOT), []
    for _, controllers, path in lines:
        if controllers == "":  # v2: one unified hierarchy
            found += _cgroup_levels(root, path, "memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):  # v1: the memory controller's own hierarchy
            found += _cgroup_levels(root / "memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes",
                                    "total_inactive_file")
    return min(found) if found else None


def _cgroup_levels(mount: Path, path: str, limit_file: str, usage_file: str, inactive: str) -> list[tuple[int, str]]:
    """(bytes left, limit file) of each limited level from the process's cgroup up to the mount. In a cgroup
    namespace (a container) the process's cgroup is the mount itself, whatever path /proc/self/cgroup shows."""
    here = mount / path.lstrip("/")
    levels = [here, *here.parents] if here.is_dir() else [mount]
    out = []
    for d in levels:
        limit = _read_int(d / limit_file)
        if limit is not None and limit < NO_LIMIT:
            usage = _read_int(d / usage_file) or 0
            stat = _read_stat(d / "memory.stat")
            out.append((max(0, limit - usage + stat.get(inactive, 0)), str(d / limit_file)))
        if d == mount:
            break
    return out


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _read_stat(path: Path) -> dict[str, int]:
    try:
        return {k: int(v) for k, v in (line.split() for line in path.read_text().splitlines() if line.strip())}
    except (OSError, ValueError):
        return {}


class CacheTooLarge(ValueError):
    """The slot KV cache the config asks for does not fit the device's free memory."""


def check_fits(model, *, slots: int, width: int, dtype: torch.dtype, device: torch.device) -> int:
    """Bytes the cache takes; raise CacheTooLarge (with the figure and the flag to change) if it cannot fit."""
    need, free = cache_bytes(model, slots=slots, width=width, dtype=dtype), free_memory(torch.device(device))
    if need > 0.9 * free:
        raise CacheTooLarge(
            f"the slot KV cache needs {need / 2**30:.2f} GiB ({slots} slots x {width} tokens) but {device} has "
            f"{free / 2**30:.2f} GiB free: lower --max-batch-episodes (or --max-new-tokens / --max-turns)")
    return need
