"""TF32 for the update's fp32 matmuls on CUDA.

Under the default `--dtype float32` an H100/H200 multiplies at ~67 TFLOP/s in full fp32 and at ~495
on TF32 tensor cores, which keep fp32's range and fp32 accumulation and round the inputs to a 10-bit
mantissa (bf16 autocast rounds them to 7). `cfg.tf32` (on by default) turns it on for the
learner's update only: sampling keeps full fp32, so a worker on any device, the held-out evaluation
and the learner's own rollouts compute the function they computed before. On CPU it means nothing.
"""

import contextlib

import torch


@contextlib.contextmanager
def matmul_precision(device: str | torch.device, *, tf32: bool):
    """Within: fp32 matmuls (cuBLAS and cuDNN) on `device` use TF32 when `tf32` and it is CUDA."""
    if not tf32 or torch.device(device).type != "cuda":
        yield
        return
    backends = [torch.backends.cuda.matmul, torch.backends.cudnn]
    new_api = all(hasattr(b, "fp32_precision") for b in backends)  # torch >= 2.9; allow_tf32 is deprecated
    attr, value = ("fp32_precision", "tf32") if new_api else ("allow_tf32", True)
    before = [getattr(b, attr) for b in backends]
    for b in backends:
        setattr(b, attr, value)
    try:
        yield
    finally:
        for b, v in zip(backends, before):
            setattr(b, attr, v)
