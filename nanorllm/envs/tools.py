"""Python functions as tools, for any env's episodes (`--tools path/to/tools.py:fn1,fn2`).

    --tools tools.py:calc,lookup     --tools module.path:calc     --tools tools.py   (the functions its TOOLS list holds)

Each function's JSON schema is transformers' `get_json_schema` of it: type hints on every argument and a
docstring with a description and an `Args:` line per argument. A function without them is refused at start,
naming it. The schemas reach the chat template as its `tools` (or the fallback Hermes block, for a template
that reads none: policy/chat_render.py); the calls are read in the template's format (policy/tool_calls.py),
or in --tool-parser's.

`ToolBundle` wraps the run's env bundle, as RewardBundle does. A reply with tool calls gets the tools' results
as the next observation, one role `tool` message per call, in the order written, and reward 0; a reply without
one goes to the inner env's step, which scores it (or, under `single`, the --reward functions do). At most
`max_calls` calls an episode run (--max-tool-calls); past them a reply goes to the inner env as its answer,
whatever it holds, so an episode has at most the inner env's turns + `max_calls` turns.

Nothing a model writes, and nothing a tool does, stops the run. A call that does not parse, names no tool, lacks a
required argument or gives one of another type than its schema's gets the reason as its result (counted in
rollout/tool_parse_failures, or rollout/tool_errors for a call that parsed); the tools run in a helper process
(envs/tool_host.py), so one that raises (sys.exit too) gets its error text (rollout/tool_errors), and so does one
still running after `timeout_s` (--tool-timeout-s), whose process is killed, or one that ends its process.
"""

from dataclasses import dataclass, replace
from typing import Callable

from nanorllm.core.limits import MAX_TOOL_CALLS, TOOL_TIMEOUT_S
from nanorllm.core.types import RolloutResult, Step
from nanorllm.envs.base import EnvBundle
from nanorllm.utils.modules import EnvSpecError
from nanorllm.envs.tool_host import host, tool_functions
from nanorllm.policy.chat_render import tool_format
from nanorllm.policy.tool_calls import ToolCall, check_call, parse
from nanorllm.utils.modules import EnvSpecError, _import_module, import_spec
from nanorllm.utils.timed import CallTimeout, call_with_limit



@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable
    schema: dict  # {"type": "function", "function": {"name", "description", "parameters"}}
    spec: str  # the --tools spec it came from: what its helper process imports (envs/tool_host.py)


def tool_schema(spec: str, fn) -> dict:
    """`fn`'s JSON schema (transformers' get_json_schema); EnvSpecError naming it when it has none."""
    from transformers.utils import get_json_schema

    name = getattr(fn, "__name__", repr(fn))
    if not callable(fn):
        raise EnvSpecError(f"{spec!r}: {name} is not a function")
    try:
        return get_json_schema(fn)
    except Exception as e:  # TypeHintParsingException, DocstringParsingException
        raise EnvSpecError(f"{spec!r}: {name} cannot be a tool: {e} (a tool needs a type hint on every argument "
                           "and a docstring with an Args: line for each)") from None


def load_tools(spec: str) -> list[Tool]:
    """The tools a spec names: where:fn1,fn2, or where alone (a module or .py file whose TOOLS list holds them)."""
    tools = [Tool(getattr(fn, "__name__", ""), fn, tool_schema(spec, fn), spec) for fn in tool_functions(spec)]
    names = [t.schema["function"]["name"] for t in tools]
    if len(set(names)) < len(names):
        raise EnvSpecError(f"{spec!r}: two tools share a name ({', '.join(names)})")
    return tools


class ToolEnv:
    """The inner env, with the tools answering the replies that call them."""

    def __init__(self, inner, tools: list[Tool], *, parser: str, max_calls: int, timeout_s: float):
        self.inner, self.parser, self.max_calls, self.timeout_s = inner, parser, max_calls, timeout_s
        self.tools = {t.schema["function"]["name"]: t for t in tools}
        self.schemas = [t.schema for t in tools]
        self.calls = 0
        self.progress = lambda: None  # the engine's hang detection hears the calls through it

    def reset(self, task: dict):
        self.calls = 0
        return self.inner.reset(task)

    def step(self, response: str) -> tuple[str | None, float, bool, dict]:
        _, calls, failures = parse(response, self.parser)
        if not (calls or failures) or self.calls >= self.max_calls:
            return self.inner.step(response)
        results, parse_failures, errors = [], 0, 0
        for item in sorted([*calls, *failures], key=lambda c: response.find(c.raw)):  # in the order written
            why = check_call(item, self.schemas)
            if self.calls >= self.max_calls:
                why = f"the limit of {self.max_calls} tool calls an episode is reached; answer without a call"
            self.calls += 1
            if why is not None:
                parse_failures += not isinstance(item, ToolCall)
                errors += isinstance(item, ToolCall)
                results.append({"name": getattr(item, "name", ""), "content": f"Error: {why}"})
                continue
            content, ok = self.run(item)
            errors += not ok
            results.append({"name": item.name, "content": content})
        info = {"tool_calls": [{"name": c.name, "arguments": c.arguments} for c in calls], "tool_results": results,
                "tool_parse_failures": parse_failures, "tool_errors": errors}
        return "\n".join(r["content"] for r in results), 0.0, False, info

    def run(self, call: ToolCall) -> tuple[str, bool]:
        """(the result's text, whether the tool returned) from the tools' helper process (envs/tool_host.py): its
        error text when it raised, ran past the limit or ended its process."""
        return host(self.tools[call.name].spec).call(call.name, call.arguments, self.timeout_s, self.progress)


class ToolAgent:
    """The inner agent, keeping the tools' schemas (the engine renders them) and their results as `tool` messages."""

    def __init__(self, inner, schemas: list[dict]):
        self.inner, self.tools = inner, schemas

    @property
    def messages(self) -> list[dict]:
        return self.inner.messages

    @property
    def trajectory(self):
        return self.inner.trajectory

    def reset(self, task: dict, observation) -> None:
        self.inner.reset(task, observation)

    def update_from_model(self, response: str) -> None:
        self.inner.update_from_model(response)

    def update_from_env(self, observation: str | None, reward: float, done: bool, info: dict) -> None:
        if done or "tool_results" not in info:
            return self.inner.update_from_env(observation, reward, done, info)
        step = self.trajectory.steps[-1]
        step.reward, step.done, step.feedback, step.info = reward, done, observation, info
        self.messages.extend({"role": "tool", "name": r["name"], "content": r["content"]} for r in info["tool_results"])
        self.trajectory.steps.append(Step(observation=observation))

    def finish(self, reward: float, *, terminated: bool, reason: str):
        return self.inner.finish(reward, terminated=terminated, reason=reason)


class ToolBundle(EnvBundle):
    """`inner`'s episodes with `tools` at hand; everything else is `inner`'s."""

    def __init__(self, inner: EnvBundle, tools: list[Tool], *, max_calls: int = MAX_TOOL_CALLS,
                 timeout_s: float = TOOL_TIMEOUT_S, parser: str = "auto"):
        self.inner, self.tools, self.max_calls, self.timeout_s = inner, tools, max_calls, timeout_s
        self.options, self.spec, self.name = inner.options, inner.spec, inner.name
        self.default_tasks, self.default_eval_tasks = inner.default_tasks, inner.default_eval_tasks
        self.settings = replace(inner.settings, max_turns=inner.settings.max_turns + max_calls)  # the engine's cap
        self.parser_name = parser
        self.parser, self.rendered_by = tool_format(None, parser)  # until the policy's tokenizer is known
        inner.use_tools([t.schema["function"]["name"] for t in tools])

    def use_tokenizer(self, tokenizer) -> None:
        if tokenizer is not None:
            self.parser, self.rendered_by = tool_format(tokenizer, self.parser_name)
        self.inner.use_tokenizer(tokenizer)

    def make_env(self) -> ToolEnv:
        return ToolEnv(self.inner.make_env(), self.tools, parser=self.parser, max_calls=self.max_calls,
                       timeout_s=self.timeout_s)

    def make_agent(self) -> ToolAgent:
        return ToolAgent(self.inner.make_agent(), [t.schema for t in self.tools])

    def load_tasks(self, spec: str, *, limit: int | None = None) -> list[dict]:
        return self.inner.load_tasks(spec, limit=limit)

    def metrics(self, results: list[RolloutResult]) -> dict:
        """Tool calls parsed per episode and the share of episodes with one; calls that did not parse, calls that
        failed and results cut to the row's bound (rollout/row_bound.py), in the batch."""
        steps = [s.info for r in results for s in r.trajectory.steps]
        calling = sum(any(s.info.get("tool_calls") for s in r.trajectory.steps) for r in results)
        return {**self.inner.metrics(results),
                "rollout/tool_calls_per_episode": sum(len(i.get("tool_calls", ())) for i in steps) / max(len(results), 1),
                "rollout/episodes_with_tool_call": calling / max(len(results), 1),
                "rollout/tool_parse_failures": sum(i.get("tool_parse_failures", 0) for i in steps),
                "rollout/tool_errors": sum(i.get("tool_errors", 0) for i in steps),
                "rollout/tool_results_truncated": sum(i.get("tool_results_truncated", 0) for i in steps)}
