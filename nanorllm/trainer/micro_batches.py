"""Micro-batches: a step's episodes cut into forward/backward passes sized for the device.

Episodes stay whole (their turns are one merged row, trainer/collate.py) and are sorted by length,
so rows of similar length share a pass and padding stays small. The padded size of a pass (rows x
longest row) is bounded by `micro_batch_tokens`: 4096 on CPU, and on CUDA what fits in the memory
free at the step (`fitting_micro_batch_tokens`).

Padding waste is measured (`pad_frac`: pad tokens / all tokens of the passes, logged as
perf/pad_frac). When a step's passes exceed `max_pad_frac` (on CUDA 0.2: a large budget puts long
and short rows in one pass) they are cut again at the length boundaries, so no pass is more than
that share padding. Regrouping moves which rows share a pass, not what is computed: the loss and the
gradient are the same up to float summation order (the normaliser is the whole step's). On CPU it is
off by default, so a seed gives the run it gave before.

Packed passes (`pack`, collate_train_batch's): a pass's rows are laid end to end, so its size is the sum
of its rows' lengths, there is no padding to bound, and `micro_batch_tokens` bounds that sum.
"""

import torch

from nanorllm.core.types import StepSample

CPU_MICRO_BATCH_TOKENS = 4096
GPU_PAD_FRAC = 0.2
# Bytes a token keeps alive through forward and backward, an estimate on the high side. Per layer
# ~10 x hidden + 4 x intermediate values are saved for the backward (norm inputs and outputs, q/k/v,
# the attention output, o_proj's input, the residual; the MLP's gate, up, activation and product),
# and the backward's gradients at most double that: 20 x hidden + 8 x intermediate, in the compute
# dtype. At a scored position the head adds the logits and, in fp32, their log-softmax, its exp, the
# entropy's product and the gradient: ~20 bytes x vocab. Counted for every token, scored or not.
LAYER_VALUES_PER_HIDDEN, LAYER_VALUES_PER_INTERMEDIATE, HEAD_BYTES_PER_VOCAB = 20, 8, 20
MEMORY_SHARE = 0.5  # of the free memory, for one pass: the allocator's fragmentation and a worker's KV cache
GPU_MICRO_BATCH_TOKENS_MAX = 65536  # past this a pass is compute-bound: bigger ones only hold more memory


def episode_length(ep: list[StepSample]) -> int:
    """Tokens of an episode's merged row: its last turn's prompt + response."""
    return len(ep[-1].prompt_ids) + len(ep[-1].response_ids)


def micro_batches(samples: list[StepSample], max_tokens: int, *, max_pad_frac: float | None = None,
                  pack: bool = False) -> list[list[StepSample]]:
    """Split into chunks of whole episodes whose padded size (rows x longest row; packed: the sum of
    the rows) stays under max_tokens; an episode longer than max_tokens gets a chunk of its own. With
    `max_pad_frac`, if the chunks' padding exceeds it, rows are also cut where a chunk would exceed that
    share (never packed: a packed pass has none)."""
    episodes: list[list[StepSample]] = []
    for s in samples:
        if episodes and episodes[-1][0].episode_id == s.episode_id:
            episodes[-1].append(s)
        else:
            episodes.append([s])
    chunks = length_chunks([episode_length(ep) for ep in episodes], max_tokens, max_pad_frac=max_pad_frac, pack=pack)
    return [[s for i in chunk for s in episodes[i]] for chunk in chunks]


def length_chunks(lengths: list[int], max_tokens: int, *, rows: int = 1, max_pad_frac: float | None = None,
                  pack: bool = False) -> list[list[int]]:
    """The items of `lengths` (each `rows` rows of up to that many tokens: an episode's merged row, a reward
    model's row or its chosen/rejected pair) as passes: their indices, shortest first, cut where a pass's
    padded size (rows x longest; packed: the sum) would pass `max_tokens`, and with `max_pad_frac` also where
    its padding would pass that share when the first cut's passes are more padding than that."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)  # similar lengths together: less padding
    chunks = _cut(order, lengths, max_tokens, rows, None, pack)
    if not pack and max_pad_frac is not None and _padding([[lengths[i] for i in c] for c in chunks]) > max_pad_frac:
        chunks = _cut(order, lengths, max_tokens, rows, max_pad_frac, pack)
    return chunks


def _cut(order: list[int], lengths: list[int], max_tokens: int, rows: int, max_pad_frac: float | None,
         pack: bool) -> list[list[int]]:
    """Greedy over items sorted by length: a new chunk when the next would break a bound."""
    chunks, cur, longest, total = [], [], 0, 0
    for i in order:
        n = lengths[i]
        wide = rows * (total + n) if pack else rows * max(longest, n) * (len(cur) + 1)
        padded = max_pad_frac is not None and 1 - rows * (total + n) / wide > max_pad_frac
        if cur and (wide > max_tokens or padded):
            chunks.append(cur)
            cur, longest, total = [], 0, 0
        cur.append(i)
        longest, total = max(longest, n), total + n
    if cur:
        chunks.append(cur)
    return chunks


def _padding(passes: list[list[int]]) -> float:
    """Pad tokens / all tokens of padded passes, each given as its rows' lengths."""
    real = sum(sum(p) for p in passes)
    padded = sum(max(p) * len(p) for p in passes)
    return 1 - real / padded if padded else 0.0


def pad_frac(chunks: list[list]) -> float:
    """Pad tokens / all tokens of the chunks' padded (rows x longest row) passes; chunks hold whole
    episodes (lists of StepSamples) or samples of whole episodes."""
    return _padding([[episode_length(ep) for ep in _episodes(chunk)] for chunk in chunks])


def _episodes(chunk: list) -> list[list[StepSample]]:
    if chunk and isinstance(chunk[0], list):
        return chunk
    eps: dict[str, list[StepSample]] = {}
    for s in chunk:
        eps.setdefault(s.episode_id, []).append(s)
    return list(eps.values())


def fitting_micro_batch_tokens(free_bytes: int, *, layers: int, hidden: int, intermediate: int, vocab: int,
                               dtype_bytes: int) -> int:
    """Padded tokens of one pass that fit in MEMORY_SHARE of `free_bytes` (see the estimate above),
    rounded down to a multiple of 1024, between 4096 and GPU_MICRO_BATCH_TOKENS_MAX."""
    per_token = (layers * (LAYER_VALUES_PER_HIDDEN * hidden + LAYER_VALUES_PER_INTERMEDIATE * intermediate)
                 * dtype_bytes + HEAD_BYTES_PER_VOCAB * vocab)
    tokens = int(MEMORY_SHARE * free_bytes / per_token) // 1024 * 1024
    return max(CPU_MICRO_BATCH_TOKENS, min(tokens, GPU_MICRO_BATCH_TOKENS_MAX))


def step_micro_batch_tokens(policy, configured: int | None) -> int:
    """`micro_batch_tokens` as configured, or (None) 4096 on CPU and what fits on CUDA now (`device_micro_batch_tokens`)."""
    dtype = policy.forward_dtype()
    return device_micro_batch_tokens(policy.model, policy.device, dtype, configured)


def device_micro_batch_tokens(model, device: torch.device, dtype: torch.dtype, configured: int | None) -> int:
    """`micro_batch_tokens` as configured, or (None) 4096 on CPU and on CUDA what fits a pass of `model`
    computing in `dtype`: the device's free memory plus what torch's allocator holds unused outside graph pools."""
    if configured is not None:
        return configured
    if device.type != "cuda":
        return CPU_MICRO_BATCH_TOKENS
    free, _ = torch.cuda.mem_get_info(device)
    free += reusable_cached_bytes(device)
    c = model.config
    return fitting_micro_batch_tokens(free, layers=c.num_hidden_layers, hidden=c.hidden_size,
                                      intermediate=getattr(c, "intermediate_size", 4 * c.hidden_size),
                                      vocab=c.vocab_size, dtype_bytes=torch.finfo(dtype).bits // 8)


def reusable_cached_bytes(device: torch.device) -> int:
    """Bytes torch's caching allocator holds unused in its default pool on `device`: a pass can take
    them. Not `memory_reserved - memory_allocated`: that also counts the free blocks of the CUDA graphs'
    private pools (a decode engine's captures in this process), which only their replays can use."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return sum(seg["total_size"] - seg["allocated_size"] for seg in torch.cuda.memory_snapshot()
               if seg["device"] == index and tuple(seg.get("segment_pool_id", (0, 0))) == (0, 0))


def step_max_pad_frac(policy, configured: float | None) -> float | None:
    """`max_pad_frac` as configured, or (None) GPU_PAD_FRAC on CUDA and off on CPU."""
    return device_max_pad_frac(policy.device, configured)


def device_max_pad_frac(device: torch.device, configured: float | None) -> float | None:
    """`max_pad_frac` as configured (1: never), or (None) GPU_PAD_FRAC on CUDA and off on CPU."""
    if configured is not None:
        return configured if configured < 1 else None
    return GPU_PAD_FRAC if torch.device(device).type == "cuda" else None
