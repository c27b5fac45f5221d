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
"""

import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from nanorllm.agents.math_agent import MathAgent
from nanorllm.core.types import RolloutResult, StepSample
from nanorllm.envs.math_env import MathEnv
from nanorllm.policy.base import Policy, SamplingParams
from nanorllm.policy.decode_batch import new_stats


@dataclass
class _Episode:
    task: dict
    episode_id: str
    group_id: str
    env: MathEnv
    agent: MathAgent
    prompt_ids: list[int] = field(default_factory=list)
    samples: list[StepSample] = field(default_factory=list)
    result: RolloutResult | None = None
    rng: object = None  # its own sampling stream (in-flight batching)
    task_index: int = 0  # position of its task in the run() call, for hang reports


MIN_SHARED_PREFIX = 8  # tokens every first prompt must share before they are computed once
EXAMPLE_TASK = {"task_id": "example", "question": "What is 12 + 34 - 5?", "answer": "41"}  # sizes graphs at start
FEEDBACK_TOKENS = 128  # room per later turn for the env's feedback and the chat markup (the cache grows past it)


def longest_episode(first_prompt: int, sampling: SamplingParams, max_turns: int) -> int:
    """Tokens the longest episode is expected to hold: what sizes each slot of the KV cache."""
    return first_prompt + max_turns * sampling.max_new_tokens + (max_turns - 1) * FEEDBACK_TOKENS


def shared_prefix(prompts: list[list[int]]) -> list[int]:
    """The longest token prefix of every prompt, less at least one token of the shortest (a row's
    first logits come from its own last prompt token)."""
    n = min(len(p) for p in prompts) - 1
    first = prompts[0]
    for p in prompts[1:]:
        n = next((i for i in range(n) if p[i] != first[i]), n)
    return first[:max(n, 0)]


class RolloutEngine:
    def __init__(self, policy: Policy, *, sampling: SamplingParams, max_turns: int = 2,
                 max_batch_episodes: int = 64, agent_kwargs: dict | None = None, grader_timeout_s: float = 5.0,
                 decode_engine: str = "slots"):
        self.policy = policy
        self.sampling = sampling
        self.max_turns = max_turns
        self.max_batch_episodes = max_batch_episodes
        self.agent_kwargs = agent_kwargs or {}
        self.grader_timeout_s = grader_timeout_s
        self.decode_engine = decode_engine  # "slots" (policy/slot_batch.py) or "dynamic" (the DecodeBatch it replaced)
        self.on_step = lambda: None  # called every decode step: a worker's heartbeat (graph replays run no hooks)
        # watch(activity, task_index): told when grading starts and ends (and beaten while a check runs),
        # so a hang detector can say whether generation or the grader stands still, and on which task.
        self.watch: Callable[[str, int], None] = lambda activity, task_index: None

    def run(self, tasks: list[dict], *, num_samples: int = 1, group_ids: list[str] | None = None,
            seed: int | None = None, sampling: SamplingParams | None = None) -> list[RolloutResult]:
        """num_samples episodes per task; results in task order, then sample order."""
        t0 = time.perf_counter()
        if seed is not None:
            self.policy.seed(seed)
        params = sampling or self.sampling
        group_ids = group_ids or [t["task_id"] for t in tasks]
        episodes = []
        for i, (task, gid) in enumerate(zip(tasks, group_ids)):
            for k in range(num_samples):
                ep = _Episode(task=task, episode_id=f"{gid}#{k}", group_id=gid, task_index=i,
                              env=MathEnv(max_turns=self.max_turns, grader_timeout_s=self.grader_timeout_s,
                                          progress=lambda i=i: self.watch("grading", i)),
                              agent=MathAgent(**self.agent_kwargs))
                ep.agent.reset(task, ep.env.reset(task))
                ep.prompt_ids = self.policy.first_prompt_ids(ep.agent.messages)
                episodes.append(ep)
        if hasattr(self.policy, "decode_batch"):
            n_generated, gen_s, stats = self._run_in_flight(episodes, params)
        else:
            n_generated, gen_s, stats = self._run_turn_by_turn(episodes, params)
        elapsed = time.perf_counter() - t0
        version = getattr(self.policy, "version", 0)
        for ep in episodes:
            ep.result.policy_version = version
            ep.result.timings = {"rollout_s": elapsed, "generate_s": gen_s, "gen_tokens": n_generated, **stats}
        return [ep.result for ep in episodes]

    def _run_in_flight(self, episodes: list[_Episode], params: SamplingParams) -> tuple[int, float, dict]:
        """One decode batch for the whole call; turns join and leave it between decode steps."""
        for ep, rng in zip(episodes, self.policy.row_generators(len(episodes))):
            ep.rng = rng
        n_generated, stats = 0, new_stats()
        t0 = time.perf_counter()
        width = self.slot_width(max(len(ep.prompt_ids) for ep in episodes), params)
        rows = min(self.max_batch_episodes, len(episodes))
        with self.policy.decode_batch(params, stats=stats, engine=self.decode_engine,
                                      slots=rows + 1, width=width) as batch:  # + the shared prefix
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
                    if self._advance(ep, gen):
                        next_turns.append((ep, state))
                    elif hasattr(batch, "release"):
                        batch.release(state)  # the episode ended: its slot is free
                waiting.extendleft(reversed(next_turns))  # next turns go before episodes not yet started
        return n_generated, time.perf_counter() - t0, stats

    def slot_width(self, first_prompt: int, params: SamplingParams | None = None) -> int:
        """Columns of the slot cache for episodes whose first prompt holds `first_prompt` tokens."""
        return -(-longest_episode(first_prompt, params or self.sampling, self.max_turns) // 64) * 64

    def prepare(self, example_task: dict, episodes: int, on_progress=None) -> float:
        """Before any rollout: allocate the slot KV cache for `episodes` episodes a call (at most
        max_batch_episodes at once) with prompts like `example_task`'s (+ 64 tokens), so its size is
        printed and a cache too large is refused at start, and on a GPU capture the decode step's
        graphs for this engine's sampling; seconds of capture (0.0 on CPU)."""
        if not hasattr(self.policy, "capture_decode_graphs"):  # an API model: nothing to prepare
            return 0.0
        agent = MathAgent(**self.agent_kwargs)
        agent.reset(example_task, MathEnv(max_turns=self.max_turns).reset(example_task))
        first = len(self.policy.first_prompt_ids(agent.messages)) + 64
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
                    if self._advance(ep, gen):
                        still_live.append(ep)
            live = still_live
        return n_generated, gen_s, {}

    def _advance(self, ep: _Episode, gen) -> bool:
        """Apply one response to its episode. True if the episode goes on to another turn."""
        agent, env = ep.agent, ep.env
        agent.update_from_model(gen.text)
        ep.samples.append(StepSample(
            task_id=ep.task["task_id"], episode_id=ep.episode_id, turn=len(ep.samples),
            prompt_ids=ep.prompt_ids, response_ids=gen.response_ids, rollout_logprobs=gen.logprobs,
            policy_version=getattr(self.policy, "version", 0), truncated=gen.truncated))
        self.watch("grading", ep.task_index)
        try:
            feedback, reward, done, info = env.step(gen.text)
        except Exception:  # one bad episode must not stop the batch: end it, keep the reason
            agent.trajectory.steps[-1].info["error"] = traceback.format_exc(limit=3)
            self._finish(ep, 0.0, terminated=False, reason="error")
            return False
        finally:
            self.watch("generating", -1)
        if done:
            agent.update_from_env(feedback, reward, done, info)
            self._finish(ep, reward, terminated=True, reason="correct" if reward > 0 else "max_turns")
            return False
        if gen.truncated:  # a cut-off response ends the episode: no retry after it
            agent.update_from_env(None, reward, True, info)
            self._finish(ep, 0.0, terminated=False, reason="truncated")
            return False
        agent.update_from_env(feedback, reward, done, info)
        ep.prompt_ids = self.policy.next_prompt_ids(ep.prompt_ids, gen.response_ids,
                                                    {"role": "user", "content": feedback})
        return True

    def _finish(self, ep: _Episode, reward: float, *, terminated: bool, reason: str) -> None:
        traj = ep.agent.finish(reward, terminated=terminated, reason=reason)
        for s in ep.samples:
            s.reward = reward
        ep.result = RolloutResult(trajectory=traj, step_samples=ep.samples, group_id=ep.group_id)
