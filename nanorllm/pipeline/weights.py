"""SharedWeights: the learner's parameters in one preallocated shared-memory buffer + a version.

Why preallocated: `share_memory_()` on fresh tensors costs over a second for a 135M model, a
`copy_` into an existing shared buffer tens of milliseconds. So the buffer is made once, before the
workers start, and every publish is a plain copy into it.

Why a seqlock and not a lock: the learner must never wait for a slow reader. The writer makes the
sequence number odd, copies, then makes it even again; a reader copies only between two equal,
even reads of the sequence number and retries otherwise, so it can never keep a torn mix of two
versions. (Stores and loads of the counter are ordered around the copies on x86 and by the thread
joins inside `copy_`; the torn-read test checks it under load.)

The buffer lives in CPU shared memory, so the same path works on every machine: on CUDA the
learner copies device->host once per publish and each worker host->device once per load.
"""

import time

import torch


class SharedWeights:
    def __init__(self, model: torch.nn.Module):
        params = list(model.named_parameters())
        self.names = [n for n, _ in params]
        self.shapes = [tuple(p.shape) for _, p in params]
        self.numels = [p.numel() for _, p in params]
        dtype = params[0][1].dtype
        self.flat = torch.empty(sum(self.numels), dtype=dtype).share_memory_()  # made once, reused
        self.state = torch.zeros(2, dtype=torch.int64).share_memory_()  # [sequence, version]
        self.publish(model, version=0)

    @property
    def version(self) -> int:
        return int(self.state[1])

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

    def _views(self) -> list[torch.Tensor]:
        return [v.view(shape) for v, shape in zip(self.flat.split(self.numels), self.shapes)]

    @torch.no_grad()
    def publish(self, model: torch.nn.Module, version: int) -> float:
        """Copy the model's parameters in and set the version; returns seconds taken."""
        t0 = time.perf_counter()
        params = dict(model.named_parameters())
        self.state[0] += 1  # odd: a write is in progress
        for name, view in zip(self.names, self._views()):
            view.copy_(params[name].detach(), non_blocking=False)
        self.state[1] = version
        self.state[0] += 1  # even again: consistent
        return time.perf_counter() - t0

    @torch.no_grad()
    def load_into(self, model: torch.nn.Module, *, max_wait_s: float = 60.0) -> tuple[int, float]:
        """Copy a consistent snapshot into the model; returns (version, seconds taken)."""
        t0 = time.perf_counter()
        params = dict(model.named_parameters())
        while True:
            seq = int(self.state[0])
            if seq % 2 == 0:
                version = int(self.state[1])
                for name, view in zip(self.names, self._views()):
                    params[name].copy_(view)
                if int(self.state[0]) == seq:
                    return version, time.perf_counter() - t0
            if time.perf_counter() - t0 > max_wait_s:
                raise TimeoutError("could not read a consistent weight snapshot")
            time.sleep(0.001)
