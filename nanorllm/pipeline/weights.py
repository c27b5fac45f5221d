"""SharedWeights: the learner's parameters in one preallocated shared-memory buffer + a version.

Flat parameters: on both sides every parameter is a view into one contiguous tensor
(`flatten_parameters`), so moving the weights is one `copy_` of one block, not hundreds of small
copies. On a CPU learner that block *is* the shared buffer: the optimizer updates the shared
weights in place and a publish only moves the version. On CUDA the learner's block lives on its
device and a publish is one device->host copy. A worker loads with one copy into its own block.

Why preallocated: `share_memory_()` on fresh tensors costs over a second for a 135M model, so the
buffer is made once, before the workers start.

Why a seqlock and not a lock: the learner must never wait for a slow reader. A writer makes the
sequence number odd before it touches the buffer (`begin_write`; on a CPU learner an optimizer
pre-step hook does it) and even again when it publishes; a reader copies only between two equal,
even reads of the sequence number and retries otherwise, so it can never keep a torn mix of two
versions. (Stores and loads of the counter are ordered around the copies on x86 and by the thread
joins inside `copy_`; the torn-read test checks it under load.)
"""

import time

import torch


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
        numel = sum(p.numel() for p in model.parameters())
        self.flat = torch.empty(numel, dtype=first.dtype).share_memory_()  # made once, reused
        self.state = torch.zeros(2, dtype=torch.int64).share_memory_()  # [sequence, version]
        self._source = flatten_parameters(model, into=self.flat if first.device.type == "cpu" else None)
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

    @torch.no_grad()
    def publish(self, version: int) -> float:
        """Make the learner's current parameters visible as `version`; returns seconds taken."""
        t0 = time.perf_counter()
        self.begin_write()
        if not self.in_place:
            self.flat.copy_(self._source)
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
                version = int(self.state[1])
                block.copy_(self.flat)
                if int(self.state[0]) == seq:
                    return version, time.perf_counter() - t0
            if time.perf_counter() - t0 > max_wait_s:
                raise TimeoutError("could not read a consistent weight snapshot")
            time.sleep(0.001)

    def close(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
