"""The weight broadcast on one device: a learner publish plus a worker's load, beside one plain copy.

What a training step pays to move the weights from the learner to a rollout worker: the learner's
`SharedWeights.publish` (on CUDA: one cast-copy into its GPU block, shared through CUDA IPC) and a
worker process's `load_into` (on the same GPU: one device-to-device copy into its replica, in
place). The ceiling beside it is one plain `copy_` of the same bytes on the same device. The
weights are random tensors in the default model's shapes (SmolLM2-135M: 134.5M parameters), fp32
and bf16 replicas. On CPU the same function measures the host shared-memory path (a dry check).
"""

import statistics
import time

import torch
import torch.multiprocessing as mp

from nanorllm.pipeline.weights import SharedWeights
from nanorllm.utils.devices import synchronize

# SmolLM2-135M: vocabulary 49152, hidden 576, MLP 1536, 30 layers, 3 KV heads of 64
VOCAB, HIDDEN, MLP, KV = 49152, 576, 1536, 192
TARGET_MS = 5.0  # publish + load of the default model on one H200


def _shapes(layers: int) -> list[tuple[int, ...]]:
    layer = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN), (MLP, HIDDEN), (MLP, HIDDEN),
             (HIDDEN, MLP), (HIDDEN,), (HIDDEN,)]
    return [(VOCAB, HIDDEN)] + layer * layers + [(HIDDEN,)]


def _model(layers: int, device: str, dtype: torch.dtype, replica_dtype: torch.dtype) -> torch.nn.Module:
    model = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(s, device=device, dtype=dtype))
                                    for s in _shapes(layers)])
    model.replica_dtype = replica_dtype
    return model



def _worker(weights: SharedWeights, layers: int, device: str, dtype: torch.dtype, n: int, versions, out) -> None:
    """A worker process: load each version as soon as it is published; report the seconds of each load."""
    block = weights.attach(_model(layers, device, dtype, dtype))
    weights.load_into(block)
    out.put(weights.reads_gpu)
    for _ in range(n):
        want = versions.get()
        while weights.version < want:
            pass
        out.put(weights.load_into(block)[1])


def _one(device: str, dtype: torch.dtype, layers: int, n: int) -> dict:
    model = _model(layers, device, torch.float32, dtype)  # fp32 masters, as the learner keeps them
    store = SharedWeights(model, readers=[device])
    ctx = mp.get_context("spawn")
    versions, out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_worker, args=(store.reader(device), layers, device, dtype, n, versions, out))
    proc.start()
    try:
        reads_gpu = out.get(timeout=300)
        publish, load = [], []
        for v in range(1, n + 1):
            with torch.no_grad():
                model[0].add_(1.0)  # an update, so every publish moves new values
            publish.append(store.publish(v))
            versions.put(v)
            load.append(out.get(timeout=60))
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
        store.close()
    src = torch.empty(store.numel, dtype=dtype, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch, outside the timing
    copies = []
    for _ in range(n):
        synchronize(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        synchronize(device)
        copies.append(time.perf_counter() - t0)
    ms = lambda xs: 1e3 * statistics.median(xs)  # noqa: E731
    return {"publish_ms": ms(publish), "load_ms": ms(load), "publish_load_ms": ms(publish) + ms(load),
            "copy_ms": ms(copies), "bytes": store.nbytes, "path": "cuda-ipc" if reads_gpu else "host"}


def figures(device: str, quick: bool) -> dict:
    """Median publish / load / plain-copy milliseconds for fp32 and bf16 replicas on `device`.

    `quick`: 2 layers instead of 30 and 5 repeats instead of 21 (a dry check)."""
    layers, n = (2, 5) if quick else (30, 21)
    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        f = _one(device, dtype, layers, n)
        out.update({f"weights/{name}/{k}": v for k, v in f.items()})
        print(f"weights {name} on {device} via {f['path']}: publish {f['publish_ms']:.2f} ms + load "
              f"{f['load_ms']:.2f} ms = {f['publish_load_ms']:.2f} ms for {f['bytes'] / 1e6:.0f} MB "
              f"(ceiling: one copy of the bytes {f['copy_ms']:.2f} ms)"
              + (f"; target <= {TARGET_MS:g} ms" if device.startswith("cuda") and not quick else ""), flush=True)
    return out


if __name__ == "__main__":
    import sys

    figures(sys.argv[1] if len(sys.argv) > 1 else "cuda" if torch.cuda.is_available() else "cpu",
            quick="--quick" in sys.argv)
