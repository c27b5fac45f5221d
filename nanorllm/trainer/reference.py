"""The KL reference (`--kl-coef > 0`): what the policy is held close to.

A full fine-tune loads a frozen copy of the initial model beside the trained one. Under LoRA the
initial model *is* the policy's base, frozen and untouched by training, so the reference is the
policy's own model with its adapters disabled for the reference forward (policy/lora.py's
AdaptersOff): no second copy of the base, which would cost what LoRA saves.
"""

from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.policy.lora import AdaptersOff


def reference_policy(policy: HFCausalPolicy, cfg, device: str, reference_model: str):
    """None without KL; otherwise an object whose `forward` is the reference's (HFCausalPolicy.forward's arguments)."""
    if not cfg.kl_coef > 0:
        return None
    if policy.peft is not None:
        return AdaptersOff(policy)
    ref = HFCausalPolicy.from_name(reference_model, device=device, dtype=cfg.dtype)
    ref.model.requires_grad_(False).eval()
    return ref
