"""The distillation teacher (`--teacher`): a frozen model that scores every token the student sampled.

On-policy distillation (GKD with the student's own samples; Thinking Machines' "on-policy distillation"):
the student samples episodes as in RL, the teacher gives each sampled token x_t its log p_teacher(x_t | x_<t)
in the learner (one no-grad forward over the same collated batch), and the clipped objective trains on
the per-token advantage

    A_t = A_env - distill_coef x (log p_student(x_t) - log p_teacher(x_t))       (A_env = 0 with distill_only)

The bracket is the one-sample estimate of the reverse KL(p_student || p_teacher) at that position, and
its policy gradient is the reverse KL's: the student moves toward what the teacher would say where the
student itself goes (mode seeking, on its own distribution, so it learns to recover from its own
mistakes). log p_student is the learner's logprob before the update (pi_prox, trainer/loss.py), not
the sampler's, so a lagged sample is scored against the student being trained and the run's importance
ratio and clip correct the sampling; both logprobs are at the run's temperature (the loss applies it to
the teacher's logits as to the student's). The term enters after
the group's advantage is computed (as slime, verl and SkyRL add it), so it is not normalised away, and
every group trains, a group whose rewards are all equal included (trainer/step.py).

Frozen, the teacher needs nothing on resume; it sits on the learner's device or `--teacher-device`,
held in --dtype like a sampling replica, and is counted in the memory plan (memory/plan.py).
"""

import torch

from nanorllm.config.errors import cannot_load, load_failure
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.policy.models import load_tokenizer
from nanorllm.trainer.update import score


class Teacher:
    """A frozen policy on its own device whose `logits(batch)` score a collated batch's targets."""

    def __init__(self, name: str, *, device: str, dtype: str):
        self.policy = HFCausalPolicy.from_name(name, device=device, dtype=dtype, replica=True)
        self.policy.model.requires_grad_(False).eval()

    @torch.no_grad()
    def logits(self, batch: dict) -> torch.Tensor:
        """(N, V) the teacher's logits at each of `batch`'s scored positions, in its dtype, on the batch's device:
        the loss reads its log-distributions a block of rows at a time (trainer/logprobs.py)."""
        device = self.policy.device
        here = batch["targets"].device
        moved = batch if here == device else {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
        return score(self.policy, moved).logits.to(here)


def load_teacher(cfg, learner_device: str) -> Teacher | None:
    """The run's teacher on `--teacher-device` (default: `learner_device`), or None without --teacher."""
    if cfg.teacher is None:
        return None
    try:
        return Teacher(cfg.teacher, device=cfg.teacher_device or learner_device, dtype=cfg.dtype)
    except (OSError, ValueError) as e:
        raise cannot_load("teacher", cfg.teacher, e, "--teacher") from None


def vocabulary_problem(student: str, teacher: str) -> str | None:
    """One line when `teacher`'s tokenizer maps tokens to ids otherwise than `student`'s (the teacher scores the
    student's token ids); read from the tokenizers alone, before any weights load."""
    vocabularies = []
    for name, whose in ((teacher, "the teacher"), (student, "the student")):
        try:
            vocabularies.append(load_tokenizer(name).get_vocab())
        except (OSError, ValueError) as e:
            return f"teacher: cannot read the tokenizer of {whose} {name!r}: {load_failure(name, e)}"
    t, s = vocabularies
    if s == t:
        return None
    diff = sorted(set(s.items()) ^ set(t.items()), key=lambda kv: kv[1])[0][0]
    return (f"teacher: {teacher!r} has another vocabulary than the student {student!r} ({len(t)} vs {len(s)} tokens; "
            f"{diff!r} is id {t.get(diff)} in the teacher, {s.get(diff)} in the student): the teacher scores the "
            "student's token ids, so both must share one tokenizer")
