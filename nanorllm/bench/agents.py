"""The --agent endpoint vs the same episodes as an --env, side by side in one run (`launch/bench.py agents`).

The same calculator episodes run twice on one policy: once as `--env calc` (the engine calls the env
between decode steps) and once as an OpenAI-client agent (`calc_agent` below: the env's prompt, worked
example, tool and grader, written as a function) whose requests come through the HTTP endpoint. Both
draw each episode's random stream the same way and render the same prompts, so they sample the same
tokens, and the difference in wall time is what the endpoint costs: HTTP, JSON, the client, the thread
hop. Figures: generated tokens/s and mean rows per decode step of each, and the endpoint's overhead per
request, (agent wall - env wall) / requests, from the fastest of `repeats` alternating runs of each.
"""

import time
from dataclasses import dataclass

from nanorllm.bench.paired import PairedConfig
from nanorllm.bench.record import record_run
from nanorllm.datasets.calc_tasks import make_calc_tasks
from nanorllm.envs.base import EpisodeSettings
from nanorllm.envs.calc_env import CALL, EXAMPLE, NO_ANSWER, SYSTEM_PROMPT
from nanorllm.envs.calculator import CalcError, calculate
from nanorllm.envs.grader import judge
from nanorllm.envs.registry import load_agent, load_env
from nanorllm.policy.base import SamplingParams
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.utils.devices import configure_threads

MAX_TURNS = 2


@dataclass
class AgentBenchConfig(PairedConfig):
    """The calculator episodes as --env calc and as an --agent through the endpoint."""


def calc_agent(task: dict, client) -> dict:
    """`--env calc`'s episode as an OpenAI-client agent: the same messages, tool and grading, turn by turn."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, *EXAMPLE, {"role": "user", "content": task["question"]}]
    for turn in range(1, MAX_TURNS + 1):
        choice = client.chat.completions.create(model="policy", messages=messages).choices[0]
        text = choice.message.content
        messages.append({"role": "assistant", "content": text})
        call, box = CALL.search(text), text.find("\\boxed")
        if call and (box < 0 or call.start() < box):
            try:
                feedback = f"Result: {calculate(call.group(1).strip())}"
            except CalcError as e:
                feedback = f"Calculator error: {e}."
        elif box >= 0:
            return {"reward": float(judge(text, task["answer"]).correct), "turns": turn}
        else:
            feedback = NO_ANSWER
        if choice.finish_reason == "length":  # a cut-off response ends the episode, as the engine ends an env's
            return {"reward": 0.0, "turns": turn, "reason": "truncated"}
        messages.append({"role": "user", "content": feedback})
    return {"reward": 0.0, "turns": MAX_TURNS, "reason": "max_turns"}


def _timed(engine: RolloutEngine, tasks: list[dict], seed: int) -> dict:
    t0 = time.perf_counter()
    out = engine.run(tasks, num_samples=1, seed=seed)
    wall = time.perf_counter() - t0
    t = out.timings
    return {"wall_s": wall, "gen_tokens": t["gen_tokens"], "tokens_per_s": t["gen_tokens"] / wall,
            "rows_per_decode_step": t["decode_rows"] / max(t["decode_steps"], 1),
            "requests": sum(len(r.step_samples) for r in out.results),
            "success": sum(r.succeeded for r in out.results) / len(out.results)}


def run_agent_bench(cfg: AgentBenchConfig) -> int:
    from nanorllm.policy.hf_causal import HFCausalPolicy

    t_start = time.perf_counter()
    configure_threads("cpu", cfg.threads, 1)
    policy = HFCausalPolicy.from_name(cfg.model)
    tasks = make_calc_tasks(count=cfg.episodes, seed=2)
    sampling = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
    settings = EpisodeSettings(max_turns=MAX_TURNS)
    env_engine = RolloutEngine(policy, sampling=sampling, env=load_env("calc", settings),
                               max_batch_episodes=cfg.episodes)
    agent_engine = RolloutEngine(policy, sampling=sampling, env=load_agent(f"{__name__}:calc_agent", settings),
                                 max_batch_episodes=cfg.episodes)
    try:
        _timed(agent_engine, tasks[:2], cfg.seed)  # warm-up: the endpoint, the client import, the cache
        runs = [(_timed(env_engine, tasks, cfg.seed), _timed(agent_engine, tasks, cfg.seed)) for _ in range(cfg.repeats)]
        env = min((e for e, _ in runs), key=lambda f: f["wall_s"])
        agent = min((a for _, a in runs), key=lambda f: f["wall_s"])
    finally:
        agent_engine.close()
    figures = {"env": env, "agent": agent,
               "same_tokens": env["gen_tokens"] == agent["gen_tokens"],
               "endpoint_overhead_ms_per_request": 1000 * (agent["wall_s"] - env["wall_s"]) / max(agent["requests"], 1)}
    for name, f in (("--env calc", env), ("--agent (endpoint)", agent)):
        print(f"[bench] {name}: {f['gen_tokens']} tokens in {f['wall_s']:.1f} s = {f['tokens_per_s']:.0f} tokens/s | "
              f"{f['rows_per_decode_step']:.1f} rows per decode step | {f['requests']} turns | "
              f"success {f['success']:.2f}")
    print(f"[bench] endpoint overhead {figures['endpoint_overhead_ms_per_request']:.1f} ms per request "
          f"(same tokens sampled: {figures['same_tokens']})")
    record_run(figures, t_start, cfg.json, model=cfg.model, episodes=cfg.episodes, threads=cfg.threads)
    return 0
