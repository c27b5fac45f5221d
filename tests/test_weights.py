"""SharedWeights: flat parameters, publish/load round trip, the optimizer write guard, no torn reads."""

import os
import signal
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from nanorllm.pipeline.weights import SharedWeights, flatten_parameters
from tests.helpers import wait_until


CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"))


def _model(fill: float = 0.0, device: str = "cpu") -> torch.nn.Module:
    m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 64)).to(device)
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(fill)
    return m


def test_flatten_keeps_values_parameter_objects_and_tied_weights():
    m = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    m[1].weight = m[0].weight  # tied, as in the default model
    with torch.no_grad():
        m[0].weight.copy_(torch.arange(40.0).view(10, 4))
    before = list(m.parameters())
    flat = flatten_parameters(m)
    assert flat.numel() == 40  # the tied weight has one slot
    assert [id(p) for p in m.parameters()] == [id(p) for p in before]
    assert torch.equal(m[1].weight, torch.arange(40.0).view(10, 4))
    flat.fill_(3.0)  # the parameters are views: writing the block writes the model
    assert bool((m[0].weight == 3.0).all()) and m[1].weight is m[0].weight


def test_publish_then_load_copies_every_parameter_and_the_version():
    src, dst = _model(), _model()
    with torch.no_grad():
        for i, p in enumerate(src.parameters()):
            p.copy_(torch.randn_like(p) + i)
    store = SharedWeights(src)
    assert store.in_place  # a CPU learner's parameters are the shared buffer
    assert src[0].weight.data_ptr() == store.flat.data_ptr()
    block = store.attach(dst)
    assert store.version == 0
    store.publish(version=7)
    version, seconds = store.load_into(block)
    assert version == 7 and seconds >= 0
    for a, b in zip(src.parameters(), dst.parameters()):
        assert torch.equal(a, b)
    assert store.nbytes == sum(p.numel() for p in src.parameters()) * 4


def test_a_replica_with_another_layout_is_refused():
    store = SharedWeights(_model())
    with pytest.raises(ValueError, match="names and shapes"):
        store.attach(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 32)))


def test_optimizer_step_hides_the_buffer_until_publish():
    learner, replica = _model(1.0), _model()
    opt = torch.optim.SGD(learner.parameters(), lr=1.0)
    store = SharedWeights(learner, opt)
    block = store.attach(replica)
    learner(torch.ones(1, 256)).sum().backward()
    opt.step()  # writes the shared buffer in place: readers must not see it yet
    assert int(store.state[0]) % 2 == 1
    with pytest.raises(TimeoutError):
        store.load_into(block, max_wait_s=0.05)
    store.publish(version=1)
    assert store.load_into(block)[0] == 1
    assert torch.equal(replica[0].weight, learner[0].weight)
    assert not torch.equal(replica[0].weight, torch.ones(256, 256))
    store.close()
    opt.step()  # hook removed: the counter no longer moves
    assert int(store.state[0]) % 2 == 0


def test_loads_copy_into_the_replica_in_place():
    src, dst = _model(), _model()
    store = SharedWeights(src)
    block = store.attach(dst)  # flattening moves the replica's parameters once, before anything records them
    ptrs = [p.data_ptr() for p in dst.parameters()]
    for version in (1, 2):
        with torch.no_grad():
            for i, p in enumerate(src.parameters()):
                p.copy_(torch.randn_like(p) * version + i)
        store.publish(version)
        assert store.load_into(block)[0] == version
        assert [p.data_ptr() for p in dst.parameters()] == ptrs  # captured CUDA graphs keep their addresses
        for a, b in zip(src.parameters(), dst.parameters()):
            assert torch.equal(a, b)


def test_cpu_readers_get_no_ipc_handle():
    store = SharedWeights(_model(), readers=["cpu", "cpu"])
    assert not store.ipc and store.device_flat is None
    reader = store.reader("cpu")
    assert reader._share is None and store._sent == []


def _reader(store: SharedWeights, want_versions: int, out, device: str = "cpu", deadline_s: float = 60.0) -> None:
    """Read until `want_versions` different versions have been seen (or the deadline passes), so the
    reads overlap many publishes however the two processes happen to be scheduled."""
    torch.set_num_threads(1)
    model = _model(device=device)
    block = store.attach(model)
    out.put("attached")  # the writer starts now, not while this process is still starting
    torn = versions = 0
    last = -1
    deadline = time.monotonic() + deadline_s
    while versions < want_versions and time.monotonic() < deadline:
        version, _ = store.load_into(block)
        # The writer fills every parameter with float(version): a consistent read is uniform and
        # equal to its version number.
        if not bool((block == block[0]).all()) or float(block[0]) != float(version):
            torn += 1
        versions += version != last
        last = version
    out.put((torn, versions, store.reads_gpu))


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_no_torn_reads_while_publishing(device):
    ctx = mp.get_context("spawn")
    model = _model(device=device)
    store = SharedWeights(model, readers=[device])
    out = ctx.Queue()
    reader = ctx.Process(target=_reader, args=(store.reader(device), 50, out, device))
    reader.start()
    assert out.get(timeout=120) == "attached"
    version = 0
    while reader.is_alive() and version < 200_000:
        version += 1
        if store.in_place:
            store.begin_write()  # the learner's parameters are the buffer: writing them is writing it
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float(version))
        store.publish(version)
        time.sleep(0.0002)  # publishes are spaced (one a step in training): a reader gets its windows
    torn, distinct, reads_gpu = out.get(timeout=90)
    reader.join(timeout=10)
    store.close()
    assert torn == 0
    assert reads_gpu == (device == "cuda")  # the GPU path was the one under test
    assert distinct >= 50, "the reader should have seen many different versions within a minute"


def _hold_and_wait(store: SharedWeights, ready) -> None:
    block = store.attach(_model(device="cuda"))
    store.load_into(block)
    ready.put(store.reads_gpu)
    signal.pause()  # killed here, holding the mapping


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_worker_killed_holding_the_gpu_block_leaves_no_gpu_memory_held():
    ctx = mp.get_context("spawn")
    base = torch.cuda.memory_allocated()
    model = _model(device="cuda")
    store = SharedWeights(model, readers=["cuda"])
    for _ in range(2):  # a restarted worker maps the same block
        ready = ctx.Queue()
        p = ctx.Process(target=_hold_and_wait, args=(store.reader("cuda"), ready))
        p.start()
        assert ready.get(timeout=120) is True
        os.kill(p.pid, signal.SIGKILL)
        p.join(timeout=30)
    store.close()  # after its readers are gone, as PipelineSource.close orders it
    del model, store
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == base


def _gone(pid: int) -> bool:
    """No such process, or only its exit status left (a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _names_pid(name: str, pid: int) -> bool:
    """A CUDA IPC producer's /dev/shm file: torch's `torch_<pid>_<random>_<n>` reference counts or the
    driver's `cuda.shm.<device>.<pid in hex>.<n>`."""
    parts = name.split(".")
    return name.startswith(f"torch_{pid}_") or (name.startswith("cuda.shm.") and len(parts) == 5
                                                and parts[3] == f"{pid:x}")


def _worker_loading(store: SharedWeights, learner_pid: int, device: str, out) -> None:
    """A pipeline worker's part: dies with its learner (lifeline.py), loads in a loop until then; it says so once a
    publish landed between two of its loads (loads and publishes overlap)."""
    from nanorllm.utils.lifeline import die_with_parent

    die_with_parent(learner_pid, poll_s=0.1)
    block = store.attach(_model(device=device))
    first, _ = store.load_into(block)
    while store.load_into(block)[0] == first:
        pass
    out.put(("loading", os.getpid(), store.reads_gpu))
    while True:
        store.load_into(block)


def _learner_publishing(device: str, out) -> None:
    """A learner that publishes back to back until it is killed, in the middle of one or between two. Its worker
    is started as a run's are: forked from a fork server, not a child of the learner."""
    from nanorllm.utils.children import process

    model = _model(device=device)
    store = SharedWeights(model, readers=[device])
    process(_worker_loading, name="nanorllm-worker-0", args=(store.reader(device), os.getpid(), device, out)).start()
    version = 0
    while True:
        version += 1
        if store.in_place:
            store.begin_write()
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float(version))
        store.publish(version)


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_a_learner_killed_while_publishing_takes_its_worker_and_the_memory_with_it(device):
    """Killed mid-publish, the learner leaves nothing: its worker exits (lifeline), no shared-memory
    file stays, and on a GPU the device's free memory is back where it was before either started
    (the learner's block, shared through CUDA IPC, goes with the processes that held it)."""
    from nanorllm.faultsuite.proc_scan import shm_entries, shm_held

    ctx = mp.get_context("spawn")
    free_before = torch.cuda.mem_get_info()[0] if device == "cuda" else 0
    out = ctx.Queue()
    shm_before = shm_entries()  # the queue's own semaphores included
    learner = ctx.Process(target=_learner_publishing, args=(device, out))
    learner.start()
    what, worker_pid, reads_gpu = out.get(timeout=120)  # once loads and publishes overlap
    assert what == "loading" and reads_gpu == (device == "cuda")
    os.kill(learner.pid, signal.SIGKILL)
    learner.join(timeout=30)
    assert wait_until(lambda: _gone(worker_pid)), "the worker outlived its learner"

    def left() -> tuple[set[str], bool]:
        """(/dev/shm entries left, whether the GPU still holds more than 64 MiB of what was free)."""
        entries = shm_entries() - shm_before - shm_held()  # an entry a live process holds is not this run's
        # Only a CUDA IPC producer's own bookkeeping may stay: torch's reference-count file and the driver's
        # file, both named by the killed learner's pid, which only that process could have unlinked.
        stray = {n for n in entries if not (device == "cuda" and _names_pid(n, learner.pid))}
        return stray, device == "cuda" and torch.cuda.mem_get_info()[0] < free_before - (64 << 20)

    assert wait_until(lambda: left() == (set(), False)), left()  # once the driver and the kernel released it


def test_seqlock_fences_are_real_fences_or_the_store_refuses_to_run(monkeypatch):
    from nanorllm.pipeline import weights

    weights._fence()  # libatomic's atomic_thread_fence where it exists (here)

    def no_library(name):
        raise OSError(name)

    monkeypatch.setattr(weights.ctypes, "CDLL", no_library)
    monkeypatch.setattr(weights.platform, "machine", lambda: "aarch64")
    with pytest.raises(RuntimeError, match="aarch64"):
        weights._load_fence()()  # weakly ordered and no fence: refuse rather than risk torn reads
    monkeypatch.setattr(weights.platform, "machine", lambda: "x86_64")
    assert weights._load_fence()() is None  # TSO needs none


def test_a_reader_that_falls_back_to_host_memory_gets_the_current_weights():
    """The GPU path's fallback, with a CPU stand-in for the learner's GPU block."""
    learner, replica = _model(1.0), _model()
    learner.replica_dtype = torch.bfloat16  # the host buffer is a cast copy, not the learner's parameters
    store = SharedWeights(learner, readers=["cuda"])
    store.device_flat, store.ipc, store._host_readers = torch.empty_like(store.flat), True, False
    reader = store.reader("cpu")
    block = reader.attach(replica)
    with torch.no_grad():
        learner[0].weight.fill_(2.0)
    store.publish(version=1)  # every reader maps the GPU block: the host buffer is left behind
    assert store.version == 1 and reader.version == 0
    reader.fall_back_to_host("test")
    store.refresh_host()  # what the learner does while it waits for episodes
    assert reader.load_into(block)[0] == 1 and bool((replica[0].weight == 2.0).all())
    with torch.no_grad():
        learner[0].weight.fill_(3.0)
    store.publish(version=2)  # from now on every publish fills the host buffer too
    assert reader.load_into(block)[0] == 2 and bool((replica[0].weight == 3.0).all())


def test_with_every_reader_on_cuda_ipc_the_host_buffer_is_made_only_when_a_reader_falls_back():
    """The learner's side of a GPU store whose readers all map its block (a CPU stand-in for that block,
    as above): no host buffer while none is needed, through publishes too; once a worker could not open
    its handle (it sets host_wanted and restarts), the next worker's weights carry a host buffer filled
    with the current version, no IPC handle, and later publishes keep it filled."""
    learner, replica = _model(1.0), _model()
    learner.replica_dtype = torch.bfloat16
    store = SharedWeights(learner, readers=["cuda"])
    store.device_flat, store.ipc, store._host_readers = torch.empty(store.numel, dtype=torch.bfloat16), True, False
    store.flat = None  # what a CUDA learner with CUDA readers allocates
    with torch.no_grad():
        learner[0].weight.fill_(2.0)
    store.publish(version=1)
    assert store.flat is None and store.version == 1 and store.nbytes == 2 * store.numel
    store.state[3] = 1  # host_wanted: what attach() sets in a worker that cannot open the handle
    reader = store.reader("cuda")
    assert reader._share is None and reader.flat is not None and store.flat is reader.flat
    block = reader.attach(replica)
    assert reader.load_into(block)[0] == 1 and bool((replica[0].weight == 2.0).all())
    with torch.no_grad():
        learner[0].weight.fill_(3.0)
    store.publish(version=2)
    assert reader.load_into(block)[0] == 2 and bool((replica[0].weight == 3.0).all())


def _attach_and_report(reader: SharedWeights, out) -> None:
    block = reader.attach(_model(device="cuda"))
    version = reader.load_into(block)[0]
    out.put((reader.reads_gpu, version, float(block[0])))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_gpu_learner_with_cuda_readers_keeps_no_host_copy_until_a_reader_falls_back():
    """On a GPU: every reader on CUDA IPC leaves no host buffer; a reader whose handle cannot be opened
    fails with the reason, and the worker started after it loads through a host buffer made then, with
    the current weights. The mapped reader is another process, as a worker is: a process cannot open
    its own CUDA IPC handle (torch 2.11's rebuild misses its own cache and the driver refuses)."""
    learner = _model(1.0, device="cuda")
    store = SharedWeights(learner, readers=["cuda"])
    try:
        assert store.ipc and store.flat is None
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        child = ctx.Process(target=_attach_and_report, args=(store.reader("cuda"), out))
        child.start()
        assert out.get(timeout=120) == (True, 0, 1.0)  # mapped through CUDA IPC, version 0's weights
        child.join(timeout=30)
        assert store.flat is None  # still no host copy
        broken = store.reader("cuda")
        broken._share = (lambda: (_ for _ in ()).throw(RuntimeError("no IPC here")), ())
        with pytest.raises(RuntimeError, match="no IPC here"):
            broken.attach(_model(device="cuda"))
        with torch.no_grad():
            learner[0].weight.fill_(2.0)
        store.publish(version=1)
        restarted = store.reader("cuda")
        replica = _model(device="cuda")
        block = restarted.attach(replica)
        assert store.flat is not None and not restarted.reads_gpu
        assert restarted.load_into(block)[0] == 1 and bool((replica[0].weight == 2.0).all())
    finally:
        store.close()
