"""SharedWeights: publish/load round trip, versions, and no torn reads under concurrent publishing."""

import torch
import torch.multiprocessing as mp

from nanorllm.pipeline.weights import SharedWeights


def _model(fill: float = 0.0) -> torch.nn.Module:
    m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 64))
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(fill)
    return m


def test_publish_then_load_copies_every_parameter_and_the_version():
    src, dst = _model(), _model()
    with torch.no_grad():
        for i, p in enumerate(src.parameters()):
            p.copy_(torch.randn_like(p) + i)
    store = SharedWeights(src)
    assert store.version == 0
    store.publish(src, version=7)
    version, seconds = store.load_into(dst)
    assert version == 7 and seconds >= 0
    for a, b in zip(src.parameters(), dst.parameters()):
        assert torch.equal(a, b)
    assert store.nbytes == sum(p.numel() for p in src.parameters()) * 4


def _reader(store: SharedWeights, n_reads: int, out) -> None:
    torch.set_num_threads(1)
    model = _model()
    torn = versions = 0
    last = -1
    for _ in range(n_reads):
        version, _ = store.load_into(model)
        values = torch.cat([p.detach().flatten() for p in model.parameters()])
        # The writer fills every parameter with float(version): a consistent read is uniform and
        # equal to its version number.
        if not bool((values == values[0]).all()) or float(values[0]) != float(version):
            torn += 1
        versions += version != last
        last = version
    out.put((torn, versions))


def test_no_torn_reads_while_publishing():
    ctx = mp.get_context("spawn")
    model = _model()
    store = SharedWeights(model)
    out = ctx.Queue()
    reader = ctx.Process(target=_reader, args=(store, 300, out))
    reader.start()
    version = 0
    while reader.is_alive() and version < 200_000:
        version += 1
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float(version))
        store.publish(model, version)
    torn, distinct = out.get(timeout=60)
    reader.join(timeout=10)
    assert torn == 0
    assert distinct > 10, "the reader should have seen many different versions"
