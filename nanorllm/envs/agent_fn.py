"""AgentBundle: an agent written as one function against the OpenAI client (`--agent path.py:fn`).

    def fn(task: dict, client: openai.OpenAI) -> float | dict      # or async, with openai.AsyncOpenAI

The function is the whole episode: it talks to the policy through `client` (whose base URL and key
point at the rollout worker's endpoint, rollout/endpoint.py) and returns the reward, or a dict with
"reward" and anything else (kept whole as the last step's info["returned"] and in the dump; "reason"
names how the episode ended, "action" is what was graded, "success" whether it succeeded, as an env's step
info says it). What it returns is checked as an env's step is (`check_agent_result`): a reward that is not a
finite number, a "reason" that is not text, a "success" that is not a bool or a value JSON cannot hold ends the
episode as an env error, as an env's protocol violation does.
The engine records the token ids and logprobs of every completion it served (rollout/agent_runner.py);
the function never sees a token. It stands where an env bundle stands, so tasks, grouping,
advantages, evaluation and the dump treat it like any env: tasks load as for the built-in envs
(`calc:...`, `arith:...`, a JSONL file of rows with a task_id).
"""

import inspect
import json
from typing import Callable, ClassVar

from nanorllm.core.limits import AGENT_TIMEOUT_S
from nanorllm.core.types import RolloutResult
from nanorllm.envs.base import EnvBundle, EnvProtocolError, EpisodeSettings, check_step


class AgentBundle(EnvBundle):
    name: ClassVar[str] = "agent"
    # an env's episodes played on the endpoint (verifiers) keep the env rule: one whose last completion was cut at
    # --max-new-tokens ends "truncated" unless rewarded; an --agent says how its own episode ended (its "reason",
    # else its reward)
    cut_ends_truncated: ClassVar[bool] = False

    def __init__(self, fn: Callable, settings: EpisodeSettings | None = None, *, timeout_s: float = AGENT_TIMEOUT_S,
                 tool_parser: str = "auto", **options):
        super().__init__(settings, **options)
        self.fn = fn
        self.is_async = inspect.iscoroutinefunction(fn)
        self.timeout_s = timeout_s  # an agent still running this long after it started is ended, and counted
        self.tool_parser = tool_parser  # the endpoint's tool-call format (policy/tool_calls.py), auto: the template's

    def metrics(self, results: list[RolloutResult]) -> dict:
        """Requests the endpoint refused (a 4xx: a bad field, a prompt past the episode's limits, a body too large)."""
        return {"rollout/agent_refused_requests": sum(s.info.get("refused_requests", 0)
                                                      for r in results for s in r.trajectory.steps)}

    def make_env(self):
        raise TypeError("an --agent episode has no Env: the agent function is the episode")

    def load_tasks(self, spec: str, *, limit: int | None = None) -> list[dict]:
        if spec == "calc" or spec.startswith("calc:"):
            from nanorllm.envs.calc_env import CalculatorTool

            return CalculatorTool().load_tasks(spec, limit=limit)
        return super().load_tasks(spec, limit=limit)


def check_agent_function(fn) -> str | None:
    """Why `fn` cannot be an agent (None if it can): it must take (task, client) positionally."""
    if not callable(fn):
        return f"{fn!r} is not a function"
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return "its signature cannot be read"
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if (len(positional) < 2 and not any(p.kind == p.VAR_POSITIONAL for p in params)) or len(required) > 2:
        shown = ", ".join(p.name for p in params)
        return f"expected fn(task, client), got fn({shown})"
    return None


def check_agent_result(value) -> tuple[float, dict]:
    """(reward, the rest of the dict) of what an agent returned, or EnvProtocolError naming the field: the
    reward is checked as an env's step reward is (envs/base.py `check_step`), the rest must be JSON."""
    extras = {k: v for k, v in value.items() if k != "reward"} if isinstance(value, dict) else {}
    _, reward, _, _ = check_step((None, value.get("reward") if isinstance(value, dict) else value, True, extras))
    for key, item in extras.items():
        try:
            json.dumps({key: item})
        except (TypeError, ValueError):
            raise EnvProtocolError(f"the returned {key!r}", "a JSON value (text, number, bool, None, list, dict)",
                                   item) from None
    return reward, extras
