"""OpenEnv environments as multi-turn episodes: `--env openenv:http://HOST:PORT` (a server the user runs) or
`--env openenv:module.path:Class` / `openenv:path/to/file.py:Class` (an OpenEnv `Environment` subclass, served for
the run on 127.0.0.1 by OpenEnv's own app, envs/openenv_serve.py).

Episodes go through OpenEnv's own client (`GenericEnvClient`, a WebSocket session per episode, so the server keeps
one env instance for the whole episode; its HTTP /reset and /step make a fresh env per request):
- `reset(task)` opens the session and resets with the task's seed (OpenEnv's server passes it only to a reset
  that takes a `seed`) and the `--env-arg reset.KEY=VALUE` arguments (an env that takes its task through them:
  OpenEnv's own ReasoningGymEnvironment ignores the seed without `dataset_name` and `size`); the observation's text
  is the user turn. When the first task seeds of a set all open with the same observation, one warning says so;
- `step(reply)` sends the model's reply as the Action's one text field (`--env-arg action_field=NAME` picks one
  when the Action has several); the result's observation is the next user turn, its `done` ends the episode
  ("done"), and so does --max-turns ("max_turns");
- an observation's text is its field `--env-arg observation_field=NAME`, else the first of `text`, `message`,
  `prompt`, `content`, `observation`, `question` that it has as text, else its only text field, else the whole
  observation as JSON (sorted keys). The choice is made once, from the server's /schema, at start;
- rewards: each step's reward is the result's (null on a step the env does not end: no reward yet, 0), and the
  episode's is their sum (`reward=sum`, the engine's rule) or the last step's alone (`reward=last`, for an env whose
  reward is a running score); the server's own value of each step is in its info (`env_reward`, with `env_done`).
  The step that ends the episode must carry a number: OpenEnv serialises a nan reward as null, so a null there is a
  score that failed, and the episode is an env error (left out of training and of evaluation's rates), never a 0.

MCP environments (an Action of OpenEnv's `CallToolAction` / `ListToolsAction`, an `MCPEnvironment` class) take a
tool name and arguments, not text: they are refused by name at start (`MCP_REFUSAL`).

Faults: one call (connect and reset, or a step) that takes longer than --env-timeout-s, a server that is down or
closes the session, a server error, or a result that is not an observation (not a JSON object, a reward that is
not a number, a `done` that is not a bool, a missing text field) ends that episode as an env error
(`rollout/env_errors`); the session is closed. At start (every process that loads the bundle) the server must
answer GET /schema and one reset, within --env-timeout-s, or the run is refused, one line, exit 2.

A server on this machine (any of its addresses, utils/net.py) is reached without the proxy variables, its
/schema and its WebSocket sessions alike (session_client).

Tasks are seeds (envs/seeds.py): `openenv:count=N,seed=S`; training uses seeds 0-1999, the held-out set
1,000,000-1,000,199.
"""

import asyncio
import concurrent.futures
import functools
import inspect
import json
import math
import numbers
import sys
import typing
import weakref
from typing import ClassVar
from urllib.parse import urlparse

from nanorllm.core.limits import ENV_TIMEOUT_S
from nanorllm.core.types import RolloutResult
from nanorllm.envs.base import EnvBundle, EnvProtocolError
from nanorllm.envs.seeds import EVAL_SEEDS, TRAIN_SEEDS, parse_seed_spec, seed_spec
from nanorllm.utils.aio import client_loop
from nanorllm.utils.modules import EnvSpecError, import_spec
from nanorllm.utils.net import is_local

PREFIX = "openenv"
PROBE_SEEDS = 4  # the first task seeds of a set whose openings are compared (warn_same_openings)
MCP_ACTIONS = ("CallToolAction", "ListToolsAction")
MCP_REFUSAL = ("an OpenEnv MCP environment (its Action is CallToolAction: a tool name and JSON arguments, not text) "
               "cannot be played by this adapter, which sends the model's reply as the Action's text field. Serve an "
               "Environment whose Action has a text field, or give the model the env's tools as Python functions "
               "(--tools file.py:fn, docs/tools.md) in an env that takes text")
TEXT_FIELDS = ("text", "message", "prompt", "content", "observation", "question")
NOT_OBSERVED = ("done", "reward", "metadata")  # what OpenEnv's server leaves out of a serialized observation
REWARDS = ("sum", "last")
SYSTEM_PROMPT = "You are acting in an environment. Read its message, then reply with your next action."
NO_TEXT = "(The environment sent no text. Take your next action.)"
FORMS = "openenv:http://HOST:PORT, openenv:module.path:Class or openenv:path/to/file.py:Class"

def call(coro, timeout_s: float, what: str, url: str):
    """`coro` run on the clients' loop, its result within `timeout_s` (else it is cancelled: TimeoutError)."""
    future = asyncio.run_coroutine_threadsafe(coro, client_loop())
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"the OpenEnv server at {url} did not answer {what} within --env-timeout-s "
                           f"{timeout_s:g} s") from None


def close_soon(client) -> None:
    """Close a session without waiting for the server (a slow or dead one must not hold the episode up)."""
    asyncio.run_coroutine_threadsafe(client.close(), client_loop())


@functools.cache
def session_client() -> type:
    """OpenEnv's GenericEnvClient, whose WebSocket to a server on this machine bypasses the proxy variables.

    websockets' connect reads them (HTTP_PROXY, ...), and OpenEnv's own bypass names only `localhost` and
    `127.0.0.1` in NO_PROXY, which a cluster's lowercase `no_proxy` overrides: a session with a server on
    0.0.0.0, or on 127.0.0.1 under such a proxy, went to the proxy and failed there."""
    from openenv.core.generic_client import GenericEnvClient
    from websockets.asyncio.client import connect as ws_connect

    class DirectWhenLocal(GenericEnvClient):
        async def connect(self):
            if self._ws is None and is_local(self._ws_url):
                try:
                    self._ws = await ws_connect(self._ws_url, open_timeout=self._connect_timeout,
                                                max_size=self._max_message_size, proxy=None)
                except Exception as e:
                    raise ConnectionError(f"Failed to connect to {self._ws_url}: {e}") from e
            return await super().connect()

    return DirectWhenLocal


def fetch_schema(url: str, timeout_s: float) -> dict:
    """The server's GET /schema: {"action": JSON schema, "observation": JSON schema, ...}."""
    import requests

    with requests.Session() as session:
        session.trust_env = not is_local(url)  # a proxy set for a cluster must not take this machine's requests
        response = session.get(url.rstrip("/") + "/schema", timeout=timeout_s)
        response.raise_for_status()
        schema = response.json()
    if not (isinstance(schema, dict) and isinstance(schema.get("action"), dict)
            and isinstance(schema.get("observation"), dict)):
        raise ValueError(f"GET {url}/schema is not an OpenEnv schema (no action and observation schemas)")
    return schema


def is_mcp_action(schema: dict) -> bool:
    """An Action schema of OpenEnv's MCP actions (one of them, or a union holding one)."""
    members = [schema, *schema.get("anyOf", ()), *schema.get("oneOf", ()), *schema.get("$defs", {}).values()]
    return any(m.get("title") in MCP_ACTIONS or {"tool_name", "arguments"} <= set(m.get("properties", {}))
               for m in members)


def text_fields(schema: dict) -> list[str]:
    """The fields of a JSON schema that hold text (a string, or a string or null)."""
    def text(p: dict) -> bool:
        return p.get("type") == "string" or any(a.get("type") == "string" for a in p.get("anyOf", ()))

    return [k for k, p in schema.get("properties", {}).items() if k not in NOT_OBSERVED and text(p)]


def choose_action_field(schema: dict, named: str, where: str) -> str:
    """The Action field the reply goes into: `named`, else the Action's only text field."""
    fields = text_fields(schema)
    if named and named not in fields:
        raise EnvSpecError(f"{where}: --env-arg action_field={named}: the Action has no text field {named!r} "
                           f"(its text fields: {', '.join(fields) or 'none'})")
    if not named and len(fields) != 1:
        raise EnvSpecError(f"{where}: the Action has {len(fields)} text fields ({', '.join(fields) or 'none'}); name "
                           "the one the model's reply goes into with --env-arg action_field=NAME")
    chosen = named or fields[0]
    others = [f for f in schema.get("required", []) if f != chosen]
    if others:
        raise EnvSpecError(f"{where}: the Action also requires {', '.join(others)}; the adapter sends only the "
                           f"model's reply, as {chosen}")
    return chosen


def choose_observation_field(schema: dict, named: str, where: str) -> str | None:
    """The observation field that is the user turn (module docstring); None: the observation as JSON."""
    fields = text_fields(schema)
    if named:
        if named not in fields:
            raise EnvSpecError(f"{where}: --env-arg observation_field={named}: the observation has no text field "
                               f"{named!r} (its text fields: {', '.join(fields) or 'none'})")
        return named
    return next((f for f in TEXT_FIELDS if f in fields), fields[0] if len(fields) == 1 else None)


def observation_text(observation: object, field: str | None) -> str:
    if not isinstance(observation, dict):
        raise EnvProtocolError("observation", "an OpenEnv observation (a JSON object)", observation)
    if field is None:
        return json.dumps(observation, sort_keys=True, default=str)
    text = observation.get(field)
    if not isinstance(text, str):
        raise EnvProtocolError(f"observation[{field!r}]", "text", text)
    return text.strip() or NO_TEXT


def step_values(result) -> tuple[float, bool]:
    """(reward, done) of a StepResult; a null reward is 0 before the end and a failed score on the step that ends the
    episode (module docstring). OpenEnv allows a bool reward: 1 or 0."""
    reward, done = result.reward, result.done
    if reward is not None and not (isinstance(reward, numbers.Real) and math.isfinite(reward)):
        raise EnvProtocolError("reward", "a finite number or null", reward)
    if not isinstance(done, bool):
        raise EnvProtocolError("done", "true or false", done)
    if reward is None and done:
        raise EnvProtocolError("reward", "a number on the step that ends the episode (a nan reward reaches the "
                                         "client as null: the score failed)", reward)
    return float(reward or 0.0), done


class OpenEnvEnv:
    """One episode: one WebSocket session of the server at `url` (see the module docstring)."""

    def __init__(self, *, url: str, action_field: str, observation_field: str | None, reward: str = "sum",
                 max_turns: int = 2, timeout_s: float = ENV_TIMEOUT_S, reset_args: dict | None = None):
        self.url, self.action_field, self.observation_field = url, action_field, observation_field
        self.reward, self.max_turns, self.timeout_s = reward, max_turns, timeout_s
        self.reset_args = reset_args or {}  # --env-arg reset.KEY=VALUE: passed to every reset beside the seed
        self.client = None
        self.turn = 0

    def reset(self, task: dict) -> str:
        self.close()
        self.client = session_client()(base_url=self.url, connect_timeout_s=self.timeout_s,
                                       message_timeout_s=self.timeout_s)
        self._finalizer = weakref.finalize(self, close_soon, self.client)  # an episode the engine ended
        self.turn = 0
        try:
            result = call(self.client.reset(**self.reset_args, seed=int(task["seed"])), self.timeout_s, "reset",
                          self.url)
            return observation_text(result.observation, self.observation_field)
        except BaseException:
            self.close()
            raise

    def step(self, response: str) -> tuple[str | None, float, bool, dict]:
        assert self.client is not None, "call reset(task) first"
        self.turn += 1
        try:
            result = call(self.client.step({self.action_field: response}), self.timeout_s, f"step {self.turn}",
                          self.url)
            reward, done = step_values(result)
            ended = done or self.turn >= self.max_turns
            text = None if ended else observation_text(result.observation, self.observation_field)
        except BaseException:  # the episode is an env error: its session goes
            self.close()
            raise
        info = {"turn": self.turn, "env_reward": result.reward, "env_done": done}
        if not ended:
            return text, reward if self.reward == "sum" else 0.0, False, info
        self.close()
        return None, reward, True, {**info, "reason": "done" if done else "max_turns"}

    def close(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            self._finalizer.detach()
            close_soon(client)


class OpenEnvBundle(EnvBundle):
    """An OpenEnv server's episodes; `bundle_class` sets `server_url` (a server the user runs) or `env_cls` and its
    Action and Observation classes (served by this process)."""

    server_url: ClassVar[str] = ""
    env_cls: ClassVar[type | None] = None
    action_cls: ClassVar[type | None] = None
    observation_cls: ClassVar[type | None] = None
    system_prompt = SYSTEM_PROMPT
    # "": chosen from the server's schema; reset: keyword arguments of every reset (--env-arg reset.KEY=VALUE)
    args = {"action_field": "", "observation_field": "", "reward": "sum", "reset": {}}
    default_tasks = seed_spec(PREFIX, TRAIN_SEEDS)
    default_eval_tasks = seed_spec(PREFIX, EVAL_SEEDS)

    def __init__(self, settings=None, **options):
        super().__init__(settings, **options)
        if self.options["reward"] not in REWARDS:
            raise ValueError(f"reward={self.options['reward']!r}: expected one of {', '.join(REWARDS)}")
        if "seed" in self.options["reset"]:
            raise ValueError("reset.seed: each task's seed is its own (tasks openenv:count=N,seed=S)")
        where, timeout_s = repr(self.name), self.settings.env_timeout_s
        try:
            schema = fetch_schema(self.url, timeout_s)
        except Exception as e:
            raise EnvSpecError(f"{where}: the OpenEnv server at {self.url} does not answer GET /schema within "
                               f"--env-timeout-s {timeout_s:g} s: {one_line(e)}") from None
        if is_mcp_action(schema["action"]):
            raise EnvSpecError(f"{where}: {MCP_REFUSAL}")
        self.action_field = choose_action_field(schema["action"], self.options["action_field"], where)
        self.observation_field = choose_observation_field(schema["observation"], self.options["observation_field"],
                                                          where)
        self.warned = False  # warn_same_openings has spoken
        try:
            self.opening = self.opening_of(TRAIN_SEEDS[0])  # what the prompt-size checks measure
        except Exception as e:
            raise EnvSpecError(f"{where}: the OpenEnv server at {self.url} cannot start an episode: "
                               f"{one_line(e)}") from None

    @property
    def url(self) -> str:
        """The server's address; for a class, this process's server of it (started on first use)."""
        if self.env_cls is None:
            return self.server_url
        from nanorllm.envs.openenv_serve import serve_environment

        return serve_environment(self.name, self.env_cls, self.action_cls, self.observation_cls).url

    def make_env(self) -> OpenEnvEnv:
        return OpenEnvEnv(url=self.url, action_field=self.action_field, observation_field=self.observation_field,
                          reward=self.options["reward"], max_turns=self.settings.max_turns,
                          timeout_s=self.settings.env_timeout_s, reset_args=self.options["reset"])

    def load_tasks(self, spec: str, *, limit: int | None = None) -> list[dict]:
        if spec != PREFIX and not spec.startswith(f"{PREFIX}:"):
            raise ValueError(f"{spec!r}: OpenEnv tasks are seeds, {PREFIX}:count=N,seed=S")
        first, count = parse_seed_spec(spec)
        count = count if limit is None else min(count, limit)
        self.warn_same_openings(range(first, first + min(count, PROBE_SEEDS)))
        return [{"task_id": f"openenv-seed{s}", "seed": s, "question": f"{self.opening}\n\n[{PREFIX} seed {s}]"}
                for s in range(first, first + count)]

    def warn_same_openings(self, seeds: range) -> None:
        """One warning (once per bundle) when every one of `seeds` opens with the same observation: an env that
        ignores the seed trains and evaluates one task, whatever the task count says."""
        if len(seeds) < 2 or self.warned:
            return
        openings = [self.opening_of(seed) for seed in seeds]
        if len(set(openings)) == 1:
            self.warned = True
            print(f"[env] warning: {self.name}: all {len(seeds)} task seeds tried ({seeds[0]}-{seeds[-1]}) open with the "
                  "same observation, so every task may be the same one. An env that takes its task through reset "
                  "arguments needs them: --env-arg reset.KEY=VALUE (OpenEnv's ReasoningGymEnvironment: "
                  "reset.dataset_name=NAME, reset.size=N); a game whose seed changes only hidden state can ignore "
                  "this", file=sys.stderr, flush=True)

    def opening_of(self, seed: int) -> str:
        probe = self.make_env()
        try:
            return probe.reset({"seed": seed})
        finally:
            probe.close()

    def metrics(self, results: list[RolloutResult]) -> dict:
        """Turns per episode, and the episodes the env itself ended (its `done`) rather than the turn limit."""
        n = max(len(results), 1)
        last = [r.trajectory.steps[-1].info if r.trajectory.steps else {} for r in results]
        return {"openenv/turns_per_episode": sum(r.trajectory.num_turns for r in results) / n,
                "openenv/episodes_done": sum(i.get("reason") == "done" for i in last) / n}


def one_line(e: BaseException) -> str:
    first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    return f"{type(e).__name__}: {first[:300]}"


def model_classes(cls) -> tuple[type | None, type | None]:
    """(Action class, Observation class) of an Environment subclass: its step's annotations
    (`step(self, action: MyAction) -> MyObservation`), else its generic arguments (`Environment[MyAction, ...]`)."""
    from openenv.core.env_server import Environment

    try:
        hints = typing.get_type_hints(cls.step)
    except Exception:
        hints = {}
    action, observation = hints.get("action"), hints.get("return")
    for klass in cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            args = typing.get_args(base)
            if typing.get_origin(base) is Environment and len(args) >= 2:
                action = action if isinstance(action, type) else args[0]
                observation = observation if isinstance(observation, type) else args[1]
    return (action if isinstance(action, type) else None), (observation if isinstance(observation, type) else None)


def served_class(spec: str, target: str) -> dict:
    """The class attributes of a bundle that serves the Environment class `target` names, refused at start when
    it is no concrete OpenEnv Environment, its Action and Observation classes cannot be told, or OpenEnv would
    serve it only one session at a time."""
    from openenv.core.env_server import Action, Environment, MCPEnvironment, Observation

    module, where, name = import_spec(spec, FORMS, target=target)
    cls = getattr(module, name, None)
    if cls is None:
        raise EnvSpecError(f"{spec!r}: {where!r} has no {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise EnvSpecError(f"{spec!r}: {name} is not an OpenEnv Environment (a subclass of "
                           "openenv.core.env_server.Environment)")
    if MCPEnvironment is not None and issubclass(cls, MCPEnvironment):  # None: OpenEnv without its MCP extra
        raise EnvSpecError(f"{spec!r}: {name} is {MCP_REFUSAL}")
    if inspect.isabstract(cls):
        raise EnvSpecError(f"{spec!r}: {name} does not implement {', '.join(sorted(cls.__abstractmethods__))}")
    action, observation = model_classes(cls)
    if not (action and issubclass(action, Action) and observation and issubclass(observation, Observation)):
        raise EnvSpecError(f"{spec!r}: cannot tell {name}'s Action and Observation classes: annotate "
                           f"step(self, action: MyAction) -> MyObservation, or subclass Environment[MyAction, "
                           "MyObservation, State]")
    if not getattr(cls, "SUPPORTS_CONCURRENT_SESSIONS", False):
        raise EnvSpecError(f"{spec!r}: {name}.SUPPORTS_CONCURRENT_SESSIONS is False: OpenEnv serves such an env one "
                           "session at a time, and a run plays many episodes at once, each its own session; set it "
                           "True if its instances share no state")
    return {"env_cls": cls, "action_cls": action, "observation_cls": observation}


def bundle_class(target: str) -> type[OpenEnvBundle]:
    """The bundle of `--env openenv:URL` or `--env openenv:module.path:Class` (module docstring)."""
    spec = f"{PREFIX}:{target}"
    if "://" in target:
        parsed = urlparse(target)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise EnvSpecError(f"{spec!r}: an OpenEnv server's URL is http://HOST:PORT or https://HOST[:PORT], got "
                               f"{target!r}")
        attrs = {"server_url": target.rstrip("/")}
    else:
        attrs = served_class(spec, target)
    label = "".join(c if c.isalnum() else "_" for c in target)
    return type(f"OpenEnv_{label}", (OpenEnvBundle,), {"name": spec, "__module__": __name__, **attrs})
