"""SharedWeights: the learner's parameters in one preallocated shared-memory buffer + a version.

Flat parameters: on both sides every parameter is a view into one contiguous tensor
(`flatten_parameters`), so moving the weights is one `copy_` of one block, not hundreds of small
copies. On a CPU learner that block *is* the shared buffer: the optimizer updates the shared
weights in place and a publish only moves the version. On CUDA the learner's block lives on its
device and a publish is one copy out of it (below). A worker loads with one copy into its own block,
in place: its parameters keep their addresses, which a decode engine's CUDA graphs depend on.

Why preallocated: `share_memory_()` on fresh tensors costs over a second for a 135M model, so the
buffer is made once, before the workers start.

What it carries is the named tensor set it is given (`params`, every parameter by default): a LoRA
run gives it the adapters alone (policy/lora.py), so a publish moves megabytes and each worker keeps
its own frozen base; the layout check on `attach` compares exactly that set.

Mixed precision: replicas sample in the compute dtype (`model.replica_dtype`, set by HFCausalPolicy),
so with bf16 the shared buffer is bf16 while the learner keeps fp32 master weights. A publish is
then one cast-copy of the fp32 block into the buffer, and every load moves half the bytes.

GPU publish (a CUDA learner with CUDA workers): the learner also keeps the flat block in the replica
dtype on its own GPU (`device_flat`: the bf16 cast of a publish runs there) and shares that
allocation with CUDA workers through torch.multiprocessing's CUDA IPC. A worker on the learner's GPU
then loads by one device-to-device copy, a worker on another GPU by one GPU-to-GPU copy: no host
round trip. Host shared memory stays the path for CPU workers, and the fallback when CUDA IPC is
unavailable: sharing fails in the learner (said once at start) or opening the handle fails in a
worker (said once by that worker, which then asks the learner to keep filling the host buffer). The
host buffer carries its own version (`host_version`), since while no reader needs it the learner
leaves it behind. When every reader is on CUDA IPC there is no host buffer at all (it would be the
whole model again in host memory: 269 MB for the default model in bf16, ~3 GB for 1.5B); a worker
that then cannot open its handle asks for one and restarts, and the learner makes it (once) before
it hands the restarted worker, and every worker after it, its weights.

Teardown order with CUDA IPC: torch counts every handle given out (`reader`) and keeps the
producer's block allocated while a count is up, and the producer must outlive its consumers' use.
So the workers stop (or are killed) first, and the learner frees the GPU block last (`close`);
PipelineSource.close does it in that order. A worker that dies holding the mapping loses it with
its process (the driver unmaps a dead process's memory) but cannot return its count: `close`
returns every count it handed out (no reader is left by then), so the block is freed there and
then instead of lingering in torch's "limbo" until the learner exits. The block is one allocation
for the whole run, mapped again by restarted workers, so worker deaths never grow GPU memory. A
learner that dies, even in the middle of a publish, takes the block with its CUDA context, and its
workers follow it (lifeline.py).

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
memory before the fence. On the GPU path the writer synchronizes its publish stream before the
fence and the even count, and a reader synchronizes its copy before the second count load, so a
copy that overlapped a publish is seen and retried as on the host. 8-byte aligned counter
loads/stores are single-copy atomic on both architectures. Without libatomic we fall back to no
fence on x86 (TSO suffices) and refuse to run elsewhere rather than risk a silently torn read. The
torn-read test checks the protocol under load, on the GPU path too where a GPU is present.
"""

import ctypes
import ctypes.util
import inspect
import platform
import sys
import time

import torch
from torch.multiprocessing.reductions import reduce_tensor

SEQ, VERSION, HOST_VERSION, HOST_WANTED = range(4)  # the shared int64 state


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
def flatten_parameters(model: torch.nn.Module, into: torch.Tensor | None = None, *,
                       params: list[torch.nn.Parameter] | None = None) -> torch.Tensor:
    """Make every parameter (or those of `params`) a view into one 1-D tensor (`into`, or a new one)
    and return that tensor.

    Parameter objects are kept (`p.data` is swapped), so optimizers and tied weights still hold
    them; `model.parameters()` lists a tied weight once, so it gets one slot.
    """
    params = list(model.parameters()) if params is None else list(params)
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


def _layout(named: list[tuple[str, torch.nn.Parameter]]) -> list[tuple[str, tuple]]:
    return [(name, tuple(p.shape)) for name, p in named]


def _ipc_counter(reduced: tuple) -> tuple:
    """(handle, offset, device) of the reference count a CUDA IPC handle from `reduce_tensor` carries."""
    rebuild, args = reduced
    named = dict(zip(inspect.signature(rebuild).parameters, args))
    return named["ref_counter_handle"], named["ref_counter_offset"], named["storage_device"]


def _release(counter: tuple) -> None:
    """Return one reference count of a CUDA IPC handle, as a reader that drops its mapping does."""
    handle, offset, device = counter
    try:
        torch.UntypedStorage._release_ipc_counter(handle, offset, device=device)
    except Exception:
        pass  # best effort, as torch's own release: the count file may already be gone


def _is_cuda(device: str | torch.device) -> bool:
    return str(device).startswith("cuda")


class SharedWeights:
    """Created by the learner from its model (which it flattens); pickled to the workers.

    `readers`: the workers' devices. With a CUDA learner and a CUDA reader the GPU publish path is
    used; None (unknown) keeps the host path only. `params`: the named tensors it carries (a LoRA
    run's adapters, policy/lora.py); every parameter of `model` by default.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                 version: int = 0, readers: list[str] | None = None,
                 params: list[tuple[str, torch.nn.Parameter]] | None = None):
        named = list(model.named_parameters()) if params is None else list(params)
        self.layout = _layout(named)
        first = named[0][1]
        self.dtype = dtype = getattr(model, "replica_dtype", first.dtype)  # what the workers' replicas store
        self.numel = numel = sum(p.numel() for _, p in named)
        self.state = torch.zeros(4, dtype=torch.int64).share_memory_()  # [sequence, version, host_version, host_wanted]
        gpu_readers = first.device.type == "cuda" and any(_is_cuda(d) for d in readers or [])
        self._host_readers = readers is None or not all(_is_cuda(d) for d in readers)
        # On a CUDA learner: the block in the replica dtype on its GPU, cast there; shared when a reader is on CUDA.
        self.device_flat = None
        if first.device.type == "cuda" and (gpu_readers or first.dtype != dtype):
            self.device_flat = torch.empty(numel, dtype=dtype, device=first.device)
        self.ipc = gpu_readers and self._can_share()
        # The host buffer, made once, reused: only where a reader needs it (every reader on CUDA IPC: none,
        # until one cannot open its handle: `host_buffer`)
        self.flat = None
        if first.device.type != "cuda" or self._host_readers or not self.ipc:
            self.flat = torch.empty(numel, dtype=dtype).share_memory_()
        shares = first.device.type == "cpu" and first.dtype == dtype
        self._source = flatten_parameters(model, into=self.flat if shares else None, params=[p for _, p in named])
        self._share = None  # a CUDA worker's side: (rebuild, args) of its CUDA IPC handle of device_flat
        self._sent: list[tuple] = []  # learner side: the IPC reference count of every handle given out
        self._reader_gpu = None  # a reader's view of the learner's GPU block (mapped through CUDA IPC in a worker)
        self._slot = VERSION  # which version this side reads: a host reader's is HOST_VERSION
        self._hook = None
        if self.in_place and optimizer is not None:  # in-place updates of the shared block are writes
            self._hook = optimizer.register_step_pre_hook(lambda *_: self.begin_write())
        self.publish(version, host=True)  # a host buffer starts filled: a fallback reader can begin

    def _can_share(self) -> bool:
        """Learner side: can this GPU block be shared? Says which path CUDA workers take, once."""
        try:
            _release(_ipc_counter(reduce_tensor(self.device_flat)))  # a trial handle, returned at once
        except Exception as e:  # e.g. no CUDA IPC on this platform, or an allocator that cannot export
            print(f"[weights] CUDA IPC unavailable ({type(e).__name__}: {e}); CUDA workers load through host "
                  "shared memory", flush=True)
            return False
        print(f"[weights] CUDA workers load from the learner's {self.device_flat.device} block through CUDA IPC",
              flush=True)
        return True

    def reader(self, device: str) -> "SharedWeights":
        """Learner side: what the worker on `device` gets (pickled to it); a CUDA worker gets a CUDA IPC
        handle, unless a worker could not open one: from then on new workers load through host memory."""
        fell_back = bool(self.state[HOST_WANTED])
        if fell_back:
            self.refresh_host()  # the host buffer exists and holds the current version before it is pickled
        out = SharedWeights.__new__(SharedWeights)
        out.__setstate__(self.__getstate__())  # exactly what the worker unpickles: no learner-side tensor
        if self.ipc and _is_cuda(device) and not fell_back:
            out._share = reduce_tensor(self.device_flat)  # (rebuild, args): one reference count per handle
            self._sent.append(_ipc_counter(out._share))
        return out

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def __getstate__(self) -> dict:  # workers get the shared buffers and counters, not the learner's side
        return {"layout": self.layout, "dtype": self.dtype, "numel": self.numel, "flat": self.flat, "state": self.state,
                "_source": None, "_hook": None,
                "device_flat": None, "ipc": self.ipc, "_host_readers": True, "_share": self._share, "_sent": [],
                "_reader_gpu": None, "_slot": HOST_VERSION}

    @property
    def version(self) -> int:
        """The newest version this side can load (the host buffer's lags while no reader needs it)."""
        return int(self.state[self._slot])

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @property
    def in_place(self) -> bool:
        """True when the learner's parameters are the shared buffer (publish copies nothing)."""
        return self._source is not None and self.flat is not None and self._source.data_ptr() == self.flat.data_ptr()

    def begin_write(self) -> None:
        """Mark the buffer as being written: readers wait until the next publish."""
        if int(self.state[SEQ]) % 2 == 0:
            self.state[SEQ] += 1
            _fence()  # the odd count is visible before any buffer store

    @torch.no_grad()
    def publish(self, version: int, *, host: bool = False) -> float:
        """Make the learner's current parameters visible as `version`; returns seconds taken.

        The host buffer is written when a reader needs it (`host`, a CPU reader, no CUDA IPC, or a
        worker that fell back to it)."""
        t0 = time.perf_counter()
        if self.flat is None and int(self.state[HOST_WANTED]):
            self._make_host_buffer()
        host = self.flat is not None and (host or self._host_readers or not self.ipc or bool(self.state[HOST_WANTED]))
        self.begin_write()
        if self.device_flat is not None:
            self.device_flat.copy_(self._source)  # on the learner's GPU: the bf16 cast runs there
        if host and not self.in_place:
            self.flat.copy_(self._source if self.device_flat is None else self.device_flat)  # one (cast-)copy
        if self.device_flat is not None and self.device_flat.is_cuda:
            torch.cuda.current_stream(self.device_flat.device).synchronize()  # the copies are done before the count
        _fence()  # every buffer store is visible before the even count
        self.state[VERSION] = version
        if host or self.in_place:
            self.state[HOST_VERSION] = version
        self.state[SEQ] += 1  # even again: consistent
        return time.perf_counter() - t0

    @torch.no_grad()
    def refresh_host(self) -> None:
        """Learner side, called while it waits: a worker that fell back to host memory asked for it,
        so the host buffer catches up with the GPU block now rather than at the next publish (whose
        update may be waiting for that worker's episodes). Where there was none (every reader was on
        CUDA IPC), it is made now, for the workers started from here on (`reader`)."""
        version = int(self.state[VERSION])
        if self.device_flat is None or not int(self.state[HOST_WANTED]):
            return
        if self.flat is None:
            self._make_host_buffer()
        elif int(self.state[HOST_VERSION]) == version:
            return
        self.begin_write()
        self.flat.copy_(self.device_flat)  # the GPU block holds the current version's bytes
        _fence()
        self.state[HOST_VERSION] = version
        self.state[SEQ] += 1

    def _make_host_buffer(self) -> None:
        """Learner side: the host buffer, late (a worker could not open its CUDA IPC handle); once."""
        print(f"[weights] a worker cannot use CUDA IPC: keeping a host copy of the weights "
              f"({self.nbytes / 2**20:.0f} MiB of shared memory) from now on", flush=True)
        self.flat = torch.empty(self.numel, dtype=self.dtype).share_memory_()

    def attach(self, model: torch.nn.Module, *, params: list[tuple[str, torch.nn.Parameter]] | None = None
               ) -> torch.Tensor:
        """Worker side: flatten a replica of the learner's model (its `params`, the same named set the
        learner's store carries); returns the block `load_into` fills.

        Call it before anything records the parameters' addresses (a decode engine's CUDA graphs):
        flattening moves them once, every load after it copies into them in place."""
        named = list(model.named_parameters()) if params is None else list(params)
        if _layout(named) != self.layout:
            raise ValueError("the worker's model does not have the learner's parameter names and shapes")
        block = flatten_parameters(model, params=[p for _, p in named])
        if block.is_cuda and self.device_flat is not None:  # a reader in the learner's process (benchmarks)
            self._reader_gpu = self.device_flat
        elif block.is_cuda and self._share is not None and self._reader_gpu is None:
            try:
                rebuild, args = self._share
                self._reader_gpu = rebuild(*args)  # maps the learner's GPU block; no copy
                self._slot = VERSION
            except Exception as e:
                reason = f"cannot open the learner's CUDA IPC block ({type(e).__name__}: {e})"
                if self.flat is None:  # every reader was on CUDA IPC: the learner kept no host copy
                    self.state[HOST_WANTED] = 1  # it makes one; the restarted worker loads through it
                    raise RuntimeError(f"{reason} and the learner keeps no host copy of the weights yet; it "
                                       "makes one now, and this worker, restarted, loads through it") from e
                self.fall_back_to_host(reason)
        return block

    def fall_back_to_host(self, reason: str) -> None:
        """Worker side: load through host shared memory from now on; the learner keeps that buffer filled."""
        print(f"[weights] {reason}; this worker loads through host shared memory", file=sys.stderr, flush=True)
        self._reader_gpu, self._slot = None, HOST_VERSION
        self.state[HOST_WANTED] = 1  # the learner fills the host buffer (refresh_host, then every publish)

    @property
    def reads_gpu(self) -> bool:
        """Worker side: loads come from the learner's GPU block (CUDA IPC), not host memory."""
        return self._reader_gpu is not None

    @torch.no_grad()
    def load_into(self, block: torch.Tensor, *, max_wait_s: float = 60.0) -> tuple[int, float]:
        """Copy a consistent snapshot into `block` (from `attach`), in place; returns (version, seconds taken)."""
        t0 = time.perf_counter()
        src = self._reader_gpu if self._reader_gpu is not None and block.is_cuda else self.flat
        while True:
            seq = int(self.state[SEQ])
            if seq % 2 == 0:
                _fence()  # no buffer load before the first count load
                version = int(self.state[self._slot])
                block.copy_(src)  # device to device (or GPU to GPU) on the IPC path
                if src.is_cuda:
                    torch.cuda.synchronize(src.device)  # the copy has read every byte before the second count load
                    torch.cuda.synchronize(block.device)
                _fence()  # no buffer load after the second count load
                if int(self.state[SEQ]) == seq:
                    return version, time.perf_counter() - t0
            if time.perf_counter() - t0 > max_wait_s:
                raise TimeoutError("could not read a consistent weight snapshot")
            time.sleep(0.001)

    def close(self) -> None:
        """Learner side, after every worker is gone: the GPU block goes last (see the module docstring)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        for counter in self._sent:  # a killed worker never returned its count; no reader is left to need it
            _release(counter)
        self._sent = []
        if self.device_flat is not None:
            self.device_flat, self.ipc = None, False
            torch.cuda.ipc_collect()  # frees the block now that no count holds it
