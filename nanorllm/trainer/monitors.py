"""The run's alarms, shown each step's episodes once: answer checks out of CPU time (the grader), a --tools run
that parses no tool call, and a policy collapsed onto one answer or a few (trainer/collapse.py). Each warns once,
through the run's `say`; what the grader's count adds to goes into the run's totals (saved in its checkpoints).

Their state is this process's: a resumed run counts its first steps, and its collapse window, from the resume."""

from typing import Callable

from nanorllm.config import TrainConfig
from nanorllm.core.types import RolloutResult
from nanorllm.policy.chat_render import tool_format
from nanorllm.policy.tool_calls import call_like
from nanorllm.trainer.collapse import CollapseAlarm
from nanorllm.trainer.metrics import grader_timeouts


class ToolAlarm:
    """With --tools: when the first --tool-alarm-steps steps parsed no tool call at all, one warning names the
    parser, what rendered the tools and a raw response (the model's format and the parser's may differ); a run
    shorter than that warns at its end (`warn`)."""

    def __init__(self, cfg: TrainConfig, tokenizer, say: Callable[[str], None]):
        self.steps, self.parser, self.tokenizer, self.say = cfg.tool_alarm_steps, cfg.tool_parser, tokenizer, say
        self.calls_seen = 0.0  # calls per episode summed over this process's first steps
        self.reply: str | None = None  # a raw response of the first step (None: no --tools step ran)
        self.said = False
        self.call_like_seen = False  # a response of those steps held a call in some family's format

    def watch(self, results: list[RolloutResult], metrics: dict, steps: int) -> None:
        """The episodes and scalars of this process's `steps`-th step."""
        if "rollout/tool_calls_per_episode" not in metrics or not self.steps or steps > self.steps:
            return
        self.calls_seen += metrics["rollout/tool_calls_per_episode"]
        responses = [s.model_response for r in results for s in r.trajectory.steps]
        self.call_like_seen = self.call_like_seen or any(map(call_like, responses))
        if self.reply is None:
            self.reply = next((text for text in responses if text), "")
        if steps == self.steps:
            self.warn(steps)

    def warn(self, steps: int) -> None:
        """The zero-call warning for the first `steps` steps, once, unless a call was parsed (or no --tools step ran)."""
        if self.reply is None or self.calls_seen or self.said:
            return
        self.said = True
        parser, rendered_by = tool_format(self.tokenizer, self.parser)
        hint = ("If the model writes calls in another format, set --tool-parser (docs/tools.md)" if self.call_like_seen
                else "No response holds a call in any format the parsers read: the model does not call tools yet; "
                "teach it the call first with a supervised warm start (docs/warm-start.md), or set --tool-parser if "
                "it writes calls in a format of its own (docs/tools.md)")
        self.say(f"[tools] warning: the first {steps} steps parsed no tool call (parser {parser}, tools rendered by "
                 f"the {rendered_by}); a response: {self.reply[:300]!r}. {hint}")


class Monitors:
    """The grader, tool and collapse alarms of a run that starts (or resumes) at `start_step`."""

    def __init__(self, cfg: TrainConfig, *, tokenizer, start_step: int, totals: dict, say: Callable[[str], None]):
        self.grader_timeout_s, self.start_step, self.totals, self.say = cfg.grader_timeout_s, start_step, totals, say
        self.tools = ToolAlarm(cfg, tokenizer, say)
        self.collapse = CollapseAlarm(cfg.collapse_alarm_steps)  # one distinct answer a group for long: a warning

    def watch(self, results: list[RolloutResult], metrics: dict, step: int) -> None:
        """Step `step`'s episodes (`step` counted from 1) and their rollout scalars, before the update."""
        self.count_grader_timeouts(results, step)
        self.tools.watch(results, metrics, step - self.start_step)
        if warning := self.collapse.feed(results, step):
            self.say(warning)

    def finished(self, step: int) -> None:
        """A run that reached its last step, `step`: one shorter than --tool-alarm-steps warns now."""
        self.tools.warn(step - self.start_step)

    def count_grader_timeouts(self, results: list[RolloutResult], step: int) -> None:
        """The first step with answer checks out of CPU time says so, with a task (then only the scalar)."""
        n, first = grader_timeouts(results)
        self.totals["grader_timeouts"] = self.totals.get("grader_timeouts", 0) + n
        if n and self.totals["grader_timeouts"] == n:
            self.say(f"[grader] step {step}: {n} answer check(s) ran out of --grader-timeout-s "
                     f"{self.grader_timeout_s:g} (scored 0, counted as reward/grader_timeouts); first: task {first}")
