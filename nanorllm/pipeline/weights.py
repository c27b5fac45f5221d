"""SharedWeights: the learner's parameters in one preallocated shared-memory buffer + a version.

Flat parameters: on both sides every parameter is a view into one contiguous tensor
(`flatten_parameters`), so moving the weights is one `copy_` of one block, not hundreds of small
copies. On a CPU learner that block *is* the shared buffer: the optimizer updates the shared
weights in place and a publish only moves the version. On CUDA the learner's block lives on its
device and a publish is one device->host copy. A worker loads with one copy into its own block.

Why preallocated: `share_memory_()` on fresh tensors costs over a second for a 135M model, so the
buffer is made once, before the workers start.

Mixed precision: replicas sample in the compute dtype (`model.replica_dtype`, set by HFCausalPolicy),
so with bf16 the shared buffer is bf16 while the learner keeps fp32 master weights. A publish is
then one cast-copy of the fp32 block into the buffer, and every load moves half the bytes.

Why a seqlock and not a lock: the learner must never wait for a slow, stopped or dead reader, and
a lock a killed process held would never be released. A writer makes the sequence number odd
before it touches the buffer (`begin_write`; on a CPU learner an optimizer pre-step hook does it)
and even again when it publishes; a reader copies only between two equal, even reads of the
sequence number and retries otherwise, so it can never keep a torn mix of two versions.

Memory ordering: what makes this hold on every CPU, not only x86. The counter and the buffer are
plain memory written by ordinary stores (torch kernels, perhaps on several OpenMP threads). x86 is
TSO: stores become visible in program order and loads are not reordered with loads, so there the
protocol needs only the compiler not to reorder, which a Python call boundary guarantees. ARMv8
(aarch64: GH200/GB200, Graviton) may make the buffer stores visible after the counter store and
may satisfy the copy's loads before the first counter load or after the second, so the protocol
needs fences exactly where the Linux kernel's seqcount puts smp_wmb / smp_rmb:

    writer: seq = odd;  FENCE;  buffer stores;  FENCE;  version, seq = even
    reader: s0 = seq;   FENCE;  version, buffer loads;  FENCE;  s1 = seq;  keep iff s0 == s1, even

`_fence()` is C11 `atomic_thread_fence(memory_order_seq_cst)` from libatomic (`dmb ish` on aarch64,
`mfence` on x86), called through ctypes: it orders every load and store of this thread before it
against every one after it. Copies run by OpenMP threads are covered too: the parallel region's
join synchronises those threads with the calling thread before our fence, and aarch64 barriers
are cumulative. A CUDA publish copies device -> host synchronously, so its bytes are in host
memory before the fence. 8-byte aligned counter loads/stores are single-copy atomic on both
architectures. Without libatomic we fall back to no fence on x86 (TSO suffices) and refuse to run
elsewhere rather than risk a silently torn read. The torn-read test checks the protocol under load.
"""

import ctypes
import ctypes.util
import platform
import time

import torch


def _load_fence():
    name = ctypes.util.find_library("atomic") or "libatomic.so.1"
    try:
        fence = ctypes.CDLL(name).atomic_thread_fence
    except (OSError, AttributeError):
        if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
            return lambda: None  # TSO: the ordering the seqlock needs is the hardware's own
        def missing():
            raise RuntimeError(f"SharedWeights needs a memory fence on {platform.machine()}: install "
                               "libatomic (e.g. apt-get install libatomic1)")
        return missing
    fence.argtypes, fence.restype = [ctypes.c_int], None
    return lambda: fence(5)  # __ATOMIC_SEQ_CST


_fence = _load_fence()


@torch.no_grad()
def flatten_parameters(model: torch.nn.Module, into: torch.Tensor | None = None) -> torch.Tensor:
    """Make every parameter a view into one 1-D tensor (`into`, or a new one) and return that tensor.

    Parameter objects are kept (`p.data` is swapped), so optimizers and tied weights still hold
    them; `model.parameters()` lists a tied weight once, so it gets one slot.
    """
    params = list(model.parameters())
    dtype, device = params[0].dtype, params[0].device
    if any(p.dtype != dtype or p.device != device for p in params):
        raise ValueError("flatten_parameters needs every parameter on one device with one dtype")
    total = sum(p.numel() for p in params)
    flat = torch.empty(total, dtype=dtype, device=device) if into is None else into
    if flat.numel() != total or flat.dtype != dtype or flat.device != device:
        raise ValueError(f"target block holds {flat.numel()} {flat.dtype} on {flat.device}; "
                         f"the model needs {total} {dtype} on {device}")
    offset = 0
    for p in params:
        view = flat[offset:offset + p.numel()].view_as(p)
        if view.data_ptr() != p.data_ptr():
            view.copy_(p)
            p.data = view
        offset += p.numel()
    return flat


def _layout(model: torch.nn.Module) -> list[tuple[str, tuple]]:
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


class SharedWeights:
    """Created by the learner from its model (which it flattens); pickled to the workers."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                 version: int = 0):
        self.layout = _layout(model)
        first = next(model.parameters())
        dtype = getattr(model, "replica_dtype", first.dtype)  # what the workers' replicas store
        numel = sum(p.numel() for p in model.parameters())
        self.flat = torch.empty(numel, dtype=dtype).share_memory_()  # made once, reused
        self.state = torch.zeros(2, dtype=torch.int64).share_memory_()  # [sequence, version]
        shares = first.device.type == "cpu" and first.dtype == dtype
        self._source = flatten_parameters(model, into=self.flat if shares else None)
        self._hook = None
        if self.in_place and optimizer is not None:  # in-place updates of the shared block are writes
            self._hook = optimizer.register_step_pre_hook(lambda *_: self.begin_write())
        self.publish(version)

    def __getstate__(self) -> dict:  # workers get the shared buffer and counters, not the learner's side
        return {"layout": self.layout, "flat": self.flat, "state": self.state, "_source": None, "_hook": None}

    @property
    def version(self) -> int:
        return int(self.state[1])

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

    @property
    def in_place(self) -> bool:
        """True when the learner's parameters are the shared buffer (publish copies nothing)."""
        return self._source is not None and self._source.data_ptr() == self.flat.data_ptr()

    def begin_write(self) -> None:
        """Mark the buffer as being written: readers wait until the next publish."""
        if int(self.state[0]) % 2 == 0:
            self.state[0] += 1
            _fence()  # the odd count is visible before any buffer store

    @torch.no_grad()
    def publish(self, version: int) -> float:
        """Make the learner's current parameters visible as `version`; returns seconds taken."""
        t0 = time.perf_counter()
        self.begin_write()
        if not self.in_place:
            self.flat.copy_(self._source)  # one (cast-)copy of the learner's block
        _fence()  # every buffer store is visible before the even count
        self.state[1] = version
        self.state[0] += 1  # even again: consistent
        return time.perf_counter() - t0

    def attach(self, model: torch.nn.Module) -> torch.Tensor:
        """Worker side: flatten a replica of the learner's model; returns the block `load_into` fills."""
        if _layout(model) != self.layout:
            raise ValueError("the worker's model does not have the learner's parameter names and shapes")
        return flatten_parameters(model)

    @torch.no_grad()
    def load_into(self, block: torch.Tensor, *, max_wait_s: float = 60.0) -> tuple[int, float]:
        """Copy a consistent snapshot into `block` (from `attach`); returns (version, seconds taken)."""
        t0 = time.perf_counter()
        while True:
            seq = int(self.state[0])
            if seq % 2 == 0:
                _fence()  # no buffer load before the first count load
                version = int(self.state[1])
                block.copy_(self.flat)
                _fence()  # no buffer load after the second count load
                if int(self.state[0]) == seq:
                    return version, time.perf_counter() - t0
            if time.perf_counter() - t0 > max_wait_s:
                raise TimeoutError("could not read a consistent weight snapshot")
            time.sleep(0.001)

    def close(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
