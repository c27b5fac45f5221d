"""TF32 for the update's fp32 matmuls on CUDA.

Under the default `--dtype float32` an H100/H200 multiplies at ~67 TFLOP/s in full fp32 and at ~495
on TF32 tensor cores, which keep fp32's range and fp32 accumulation and round the inputs to a 10-bit
mantissa (bf16 autocast rounds them to 7). `cfg.tf32` (on by default) turns it on for the
learner's update only: sampling keeps full fp32, so a worker on any device, the held-out evaluation
and the learner's own rollouts compute the function they computed before. On CPU it means nothing.

It is set with `torch.set_float32_matmul_precision("high")`, which keeps torch's two views of the
setting in step (the legacy `allow_tf32` and the per-backend `fp32_precision`). Setting only
`torch.backends.cuda.matmul.fp32_precision = "tf32"` leaves them disagreeing, and then every fp32
cuBLAS matmul fails torch's own consistency check ("mix of the legacy and new APIs").
"""

import contextlib

import torch


@contextlib.contextmanager
def matmul_precision(device: str | torch.device, *, tf32: bool):
    """Within: fp32 matmuls on `device` use TF32 when `tf32` and it is CUDA; the previous setting after."""
    if not tf32 or torch.device(device).type != "cuda":
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # TF32 for fp32 matmuls (bf16 autocast is unaffected)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)
