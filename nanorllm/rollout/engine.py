"""RolloutEngine: runs many agent-env-policy episodes at once.

With a local model (a policy that has `decode_batch`) the engine keeps one running decode batch of
up to `max_batch_episodes` rows: a turn leaves the batch the step it ends, the env answers at once,
and the episode's next turn joins the running batch, prefilling only the tokens its last turn's KV
cache does not hold; first turns start from one cached copy of the prompt prefix they all share
(chat template, system prompt, worked example). Each episode samples from its own random stream (drawn in episode order from
the run's seed), so its tokens do not depend on what shares its batch.

A policy that only has `generate` (an API model) runs turn by turn: every live episode of every
group goes into one `generate` call per turn (chunked to `max_batch_episodes`), and the survivors
get the env's feedback and go again.

The env and the agent of each episode come from an `EnvBundle` (envs/base.py; `--env`), the math
self-refine bundle by default. An episode's reward is the sum of its steps' rewards. An exception in
`env.reset` or `env.step`, or a result the protocol does not allow (envs/base.py `check_reset` /
`check_step`: a reward that is not a finite number, a `done` that is not a bool, ...), ends only that
episode (reason "error", printed once per distinct error); the trainer leaves such episodes out of
their groups. Every turn keeps the row's bound (rollout/row_bound.py): a tool result is cut to the room the
row has left, and an env turn that would take the row past the model's context ends its episode (counted in
rollout/context_overflows). `watch` hears "grading" around
each env call (reset and step), "reward function <spec>" while a --reward function scores the call's
episodes, and "generating" after either: a worker's heartbeat.

A bundle with `seats` > 1 is a game: rollout/games.py plays it, a seat per player, each policy seat an episode.

With `--agent` (an AgentBundle) the episodes are the user's functions talking to an OpenAI-compatible
endpoint, and their requests join the running decode batch (rollout/agent_runner.py).
"""

import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from nanorllm.core.types import RolloutBatch, RolloutResult, StepSample, Trajectory, ending
from nanorllm.envs.agent_fn import AgentBundle
from nanorllm.envs.base import Agent, Env, EnvBundle, EnvProtocolError, EpisodeSettings, check_reset, check_step
from nanorllm.envs.registry import DEFAULT_ENV, load_env
from nanorllm.policy.base import Policy, SamplingParams
from nanorllm.policy.slot_batch import new_stats
from nanorllm.policy.slot_cache import trim_host_heap
from nanorllm.rollout.agent_runner import AgentRunner
from nanorllm.rollout.games import MODEL_FREE, GameRunner
from nanorllm.rollout.row_bound import cut_text, cut_tool_results, feedback_chars, row_tokens
from nanorllm.utils.faults import env_response


@dataclass
class _Episode:
    task: dict
    episode_id: str
    group_id: str
    env: Env
    agent: Agent
    prompt_ids: list[int] = field(default_factory=list)
    samples: list[StepSample] = field(default_factory=list)
    result: RolloutResult | None = None
    rng: object = None  # its own sampling stream (in-flight batching)
    task_index: int = 0  # position of its task in the run() call, for hang reports


MIN_SHARED_PREFIX = 8  # tokens every first prompt must share before they are computed once
EXAMPLE_TASK = {"task_id": "example", "question": "What is 12 + 34 - 5?", "answer": "41"}  # sizes graphs at start
FEEDBACK_TOKENS = 128  # room per later turn for the env's feedback and the chat markup (the cache grows past it)


def feedback_tokens(sampling: SamplingParams, seats: int = 1) -> int:
    """Room a later turn's observation takes: the env's feedback and the chat markup, and in a game of `seats`
    players the other seats' replies since this seat last moved (TextArena shows each player every message)."""
    return FEEDBACK_TOKENS + (seats - 1) * sampling.max_new_tokens


def longest_episode(first_prompt: int, sampling: SamplingParams, max_turns: int, seats: int = 1) -> int:
    """Tokens the longest episode (a game's: one seat's row) is expected to hold: what sizes each slot of the KV
    cache."""
    return first_prompt + max_turns * sampling.max_new_tokens + (max_turns - 1) * feedback_tokens(sampling, seats)


def shared_prefix(prompts: list[list[int]]) -> list[int]:
    """The longest token prefix of every prompt, less at least one token of the shortest (a row's
    first logits come from its own last prompt token)."""
    n = min(len(p) for p in prompts) - 1
    first = prompts[0]
    for p in prompts[1:]:
        n = next((i for i in range(n) if p[i] != first[i]), n)
    return first[:max(n, 0)]


_reported_errors: set[tuple] = set()  # (exception type, file, line): printed once per process


def report_env_error(spec: str, task_id: str, where: str) -> str:
    """The current exception's traceback (for a protocol violation, its one line); printed to stderr the
    first time this error is seen."""
    exc_type, exc, tb = sys.exc_info()
    dropped = "the episode is dropped (counted in rollout/env_errors; this error is printed once)"
    if isinstance(exc, EnvProtocolError):
        key, text = (where, *exc.key), str(exc)
        line = f"env.{where} on task {task_id} returned what the env protocol (envs/base.py) does not allow: " \
               f"{text}; {dropped}"
    else:
        frames = traceback.extract_tb(tb)
        key = (exc_type.__name__, frames[-1].filename, frames[-1].lineno) if frames else (exc_type.__name__,)
        text = traceback.format_exc(limit=-8)
        line = f"env.{where} raised on task {task_id}; {dropped}:\n{text}"
    if key not in _reported_errors:
        _reported_errors.add(key)
        print(f"[env] {spec}: {line}", file=sys.stderr, flush=True)
    return text


class RolloutEngine:
    def __init__(self, policy: Policy, *, sampling: SamplingParams, env: EnvBundle | None = None,
                 max_turns: int = 2, max_batch_episodes: int = 64, opponent: str | None = None,
                 opponent_policy: Policy | None = None):
        """`env`: the episodes' bundle; without one, the default bundle with `max_turns`. `opponent`: who plays a
        game's other seats (rollout/games.py); None: the env's settings' (--opponent). A model opponent is
        `opponent_policy`, frozen (trainer/training_engine.py loads it), as is the snapshot pool of "pool"
        (rollout/opponent_pool.py)."""
        self.policy = policy
        self.sampling = sampling
        self.env = env or load_env(DEFAULT_ENV, EpisodeSettings(max_turns=max_turns))
        self.opponent = opponent or self.env.settings.opponent
        self.opponent_policy = opponent_policy
        if getattr(self.env, "seats", 1) > 1 and self.opponent not in MODEL_FREE and opponent_policy is None:
            raise ValueError(f"opponent {self.opponent!r} is a model or the snapshot pool: pass it as opponent_policy")
        self.env.use_tokenizer(getattr(policy, "tokenizer", None))  # a bundle that reads the model's tool-call format
        self.max_turns = self.env.settings.max_turns  # a cap for any env: none runs longer
        self.row_tokens = row_tokens(policy, self.env.settings.max_row_tokens)  # rollout/row_bound.py
        if hasattr(self.env, "use_device"):  # a reward model scores on this process's device unless told otherwise
            self.env.use_device(getattr(policy, "device", None))
        self.max_batch_episodes = max_batch_episodes
        self.on_step = lambda: None  # called every decode step: a worker's heartbeat (graph replays run no hooks)
        # watch(activity, task_index): told when the env's reset or step ("grading") starts and ends (and
        # beaten while a check runs), and when a reward function runs ("reward function <spec>", task -1), so a
        # hang detector can say whether generation, the env or a reward function stands still, and on which task.
        self.watch: Callable[[str, int], None] = lambda activity, task_index: None

    def run(self, tasks: list[dict], *, num_samples: int = 1, group_ids: list[str] | None = None,
            seed: int | None = None, sampling: SamplingParams | None = None) -> RolloutBatch:
        """num_samples episodes per task (results in task order, then sample order) and the call's timings."""
        try:
            return self._run(tasks, num_samples, group_ids, seed, sampling)
        finally:
            trim_host_heap(getattr(self.policy, "device", None))  # the call's freed prefill and decode buffers

    def _run(self, tasks: list[dict], num_samples: int, group_ids: list[str] | None, seed: int | None,
             sampling: SamplingParams | None) -> RolloutBatch:
        t0 = time.perf_counter()
        if seed is not None:
            self.policy.seed(seed)
        params = sampling or self.sampling
        group_ids = group_ids or [t["task_id"] for t in tasks]
        if isinstance(self.env, AgentBundle):  # --agent: the episodes are the user's functions (rollout/agent_runner.py)
            return self._run_agents(tasks, num_samples, group_ids, params, t0)
        if getattr(self.env, "seats", 1) > 1:  # a game: a seat per player, turns alternating (rollout/games.py)
            return self._run_games(tasks, num_samples, group_ids, params, seed, t0)
        episodes = []
        for i, (task, gid) in enumerate(zip(tasks, group_ids)):
            for k in range(num_samples):
                ep = _Episode(task=task, episode_id=f"{gid}#{k}", group_id=gid, task_index=i,
                              env=self.env.make_env(), agent=self.env.make_agent())
                if hasattr(ep.env, "progress"):  # an env that can report progress inside a long step
                    ep.env.progress = lambda i=i: self.watch("grading", i)
                episodes.append(ep)
                if self._reset(ep):
                    ep.prompt_ids = self.policy.first_prompt_ids(ep.agent.messages, getattr(ep.agent, "tools", None))
        live = [ep for ep in episodes if ep.result is None]
        if not live:
            n_generated, gen_s, stats = 0, 0.0, {}
        elif hasattr(self.policy, "decode_batch"):
            n_generated, gen_s, stats = self._run_in_flight(live, params)
        else:
            n_generated, gen_s, stats = self._run_turn_by_turn(live, params)
        score_batch = getattr(self.env, "score_batch", None)  # --reward functions: the call's episodes at once
        if score_batch is not None:  # each function heard as "reward function <spec>" while it runs
            score_batch([ep.result for ep in episodes], watch=lambda activity: self.watch(activity, -1))
            self.watch("generating", -1)
        elapsed = time.perf_counter() - t0
        version = getattr(self.policy, "version", 0)
        for ep in episodes:
            ep.result.policy_version = version
        return RolloutBatch([ep.result for ep in episodes],
                            {"rollout_s": elapsed, "generate_s": gen_s, "gen_tokens": n_generated, **stats})

    def _run_agents(self, tasks: list[dict], num_samples: int, group_ids: list[str], params: SamplingParams,
                    t0: float) -> RolloutBatch:
        """Agent-function episodes through this engine's OpenAI-compatible endpoint (started once)."""
        if getattr(self, "agents", None) is None:
            self.agents = AgentRunner(self, self.env, shared_prefix=shared_prefix, min_shared=MIN_SHARED_PREFIX)
        results, n_generated, gen_s, stats = self.agents.run(tasks, num_samples=num_samples, group_ids=group_ids,
                                                             params=params)
        version = getattr(self.policy, "version", 0)
        for r in results:
            r.policy_version = version
        return RolloutBatch(results, {"rollout_s": time.perf_counter() - t0, "generate_s": gen_s,
                                      "gen_tokens": n_generated, **stats})

    def _run_games(self, tasks: list[dict], num_samples: int, group_ids: list[str], params: SamplingParams,
                   seed: int | None, t0: float) -> RolloutBatch:
        """num_samples games per task, each policy seat an episode of its own (rollout/games.py)."""
        runner = GameRunner(self, shared_prefix=shared_prefix, min_shared=MIN_SHARED_PREFIX,
                            report_error=report_env_error)
        results, n_generated, gen_s, stats = runner.run(tasks, num_samples, group_ids, params, seed)
        version = getattr(self.policy, "version", 0)
        for r in results:
            r.policy_version = version
        return RolloutBatch(results, {"rollout_s": time.perf_counter() - t0, "generate_s": gen_s,
                                      "gen_tokens": n_generated, **stats}, unplayed=runner.unplayed)

    def close(self) -> None:
        """Stop what the engine started beside the model: an --agent run's endpoint."""
        if getattr(self, "agents", None) is not None:
            self.agents.close()
            self.agents = None

    def _run_in_flight(self, episodes: list[_Episode], params: SamplingParams) -> tuple[int, float, dict]:
        """One decode batch for the whole call; turns join and leave it between decode steps."""
        for ep, rng in zip(episodes, self.policy.row_generators(len(episodes))):
            ep.rng = rng
        n_generated, stats = 0, new_stats()
        t0 = time.perf_counter()
        width = self.slot_width(max(len(ep.prompt_ids) for ep in episodes), params)
        rows = min(self.max_batch_episodes, len(episodes))
        with self.policy.decode_batch(params, stats=stats, slots=rows + 1, width=width) as batch:  # + the prefix
            shared = shared_prefix([ep.prompt_ids for ep in episodes])
            start = batch.cache_prefix(shared) if len(episodes) > 1 and len(shared) >= MIN_SHARED_PREFIX else None
            waiting = deque((ep, start) for ep in episodes)  # (episode, KV state its prompt extends)
            while waiting or len(batch):
                joining = [waiting.popleft() for _ in range(min(self.max_batch_episodes - len(batch), len(waiting)))]
                batch.join([(ep, ep.prompt_ids, ep.rng, state) for ep, state in joining])
                self.on_step()
                next_turns = []
                for ep, gen, state in batch.step():
                    n_generated += len(gen.response_ids)
                    if self._advance(ep, gen, params):
                        next_turns.append((ep, state))
                    else:
                        batch.release(state)  # the episode ended: its slot is free
                waiting.extendleft(reversed(next_turns))  # next turns go before episodes not yet started
        return n_generated, time.perf_counter() - t0, stats

    def slot_width(self, first_prompt: int, params: SamplingParams | None = None) -> int:
        """Columns of the slot cache for episodes whose first prompt holds `first_prompt` tokens."""
        seats = getattr(self.env, "seats", 1)
        return -(-longest_episode(first_prompt, params or self.sampling, self.max_turns, seats) // 64) * 64

    def prepare(self, example_task: dict, episodes: int, on_progress=None) -> float:
        """Before any rollout: allocate the slot KV cache for `episodes` episodes a call (at most
        max_batch_episodes at once) with prompts like `example_task`'s (+ 64 tokens), so its size is
        printed and a cache too large is refused at start, and on a GPU capture the decode step's
        graphs for this engine's sampling; seconds of capture (0.0 on CPU)."""
        if not hasattr(self.policy, "capture_decode_graphs"):  # an API model: nothing to prepare
            return 0.0
        agent = self.env.make_agent()  # the env's prompt around a typical question; the env itself is not run
        agent.reset(example_task, example_task["question"])
        first = len(self.policy.first_prompt_ids(agent.messages, getattr(agent, "tools", None))) + 64
        rows = min(self.max_batch_episodes, episodes)
        return self.policy.capture_decode_graphs(self.sampling, slots=rows + 1, width=self.slot_width(first),
                                                 on_progress=on_progress)

    def _run_turn_by_turn(self, episodes: list[_Episode], params: SamplingParams) -> tuple[int, float, dict]:
        """One `generate` call per turn for every live episode (chunked to max_batch_episodes)."""
        live, n_generated, gen_s = list(episodes), 0, 0.0
        while live:
            still_live = []
            for i in range(0, len(live), self.max_batch_episodes):
                chunk = live[i:i + self.max_batch_episodes]
                tg = time.perf_counter()
                gens = self.policy.generate([e.agent.messages for e in chunk], [e.prompt_ids for e in chunk], params)
                gen_s += time.perf_counter() - tg
                for ep, gen in zip(chunk, gens):
                    n_generated += len(gen.response_ids)
                    if self._advance(ep, gen, params):
                        still_live.append(ep)
            live = still_live
        return n_generated, gen_s, {}

    def _reset(self, ep: _Episode) -> bool:
        """Open the episode. False (and the episode ended as an error) if the env raised."""
        self.watch("grading", ep.task_index)
        try:
            ep.agent.reset(ep.task, check_reset(ep.env.reset(ep.task)))
        except Exception:
            report_env_error(self.env.spec, ep.task["task_id"], "reset")
            traj = Trajectory(task_id=ep.task["task_id"], task=dict(ep.task), termination_reason="error")
            ep.result = RolloutResult(trajectory=traj, step_samples=[], group_id=ep.group_id)
        # not in a `finally`: a process that dies inside the env (sys.exit, a hang's kill) is reported as grading
        self.watch("generating", -1)
        return ep.result is None

    def _advance(self, ep: _Episode, gen, params: SamplingParams) -> bool:
        """Apply one response to its episode. True if the episode goes on to another turn."""
        agent, env = ep.agent, ep.env
        agent.update_from_model(gen.text)
        n_messages, n_steps = len(agent.messages), len(agent.trajectory.steps)
        ep.samples.append(StepSample(
            task_id=ep.task["task_id"], episode_id=ep.episode_id, turn=len(ep.samples),
            prompt_ids=ep.prompt_ids, response_ids=gen.response_ids, rollout_logprobs=gen.logprobs,
            policy_version=getattr(self.policy, "version", 0), truncated=gen.truncated))
        self.watch("grading", ep.task_index)
        try:
            feedback, reward, done, info = check_step(env.step(env_response(gen.text)))
        except Exception:  # one bad episode must not stop the batch: end it, keep the reason
            agent.trajectory.steps[-1].info["error"] = report_env_error(self.env.spec, ep.task["task_id"], "step")
            self.watch("generating", -1)
            self._finish(ep, terminated=False, reason="error")
            return False
        self.watch("generating", -1)
        feedback, info = self._bounded(ep, gen, params, feedback, info)
        if done:
            agent.update_from_env(feedback, reward, done, info)
            self._finish(ep, terminated=True, reason=ending(info.get("reason"), reward, cut=gen.truncated))
            return False
        if gen.truncated or feedback is None or len(ep.samples) >= self.max_turns:
            # a cut-off response ends the episode (no retry after it), as does an env with nothing to
            # say or one that would go past the turn limit
            agent.update_from_env(None, reward, True, info)
            self._finish(ep, terminated=False, reason="truncated" if gen.truncated else "max_turns")
            return False
        agent.update_from_env(feedback, reward, done, info)
        prompt_ids = self.policy.next_prompt_ids(ep.prompt_ids, gen.response_ids, agent.messages[n_messages:],
                                                 getattr(agent, "tools", None))
        if self.row_tokens is not None and len(prompt_ids) + params.max_new_tokens > self.row_tokens:
            # the next turn would pass the row's bound (rollout/row_bound.py): refused, the episode ends here
            del agent.messages[n_messages:], agent.trajectory.steps[n_steps:]
            agent.update_from_env(feedback, reward, True, {**info, "context_overflow": True})
            self._finish(ep, terminated=False, reason="truncated")
            return False
        ep.prompt_ids = prompt_ids
        return True

    def _bounded(self, ep: _Episode, gen, params: SamplingParams, feedback: str | None,
                 info: dict) -> tuple[str | None, dict]:
        """The env's turn cut at the row's character bound, and each tool result cut to its share of the tokens the
        row has left after this response and the next one's max_new_tokens (rollout/row_bound.py)."""
        chars = feedback_chars(self.row_tokens)
        room = None if self.row_tokens is None else \
            self.row_tokens - len(ep.prompt_ids) - len(gen.response_ids) - params.max_new_tokens
        return (None if feedback is None else cut_text(feedback, chars=chars),
                cut_tool_results(info, room=room, chars=chars, tokenizer=getattr(self.policy, "tokenizer", None)))

    def _finish(self, ep: _Episode, *, terminated: bool, reason: str) -> None:
        """End the episode; its reward is the sum of its steps' rewards."""
        reward = sum(s.reward for s in ep.agent.trajectory.steps)
        traj = ep.agent.finish(reward, terminated=terminated, reason=reason)
        for s in ep.samples:
            s.reward = reward
        ep.result = RolloutResult(trajectory=traj, step_samples=ep.samples, group_id=ep.group_id)
