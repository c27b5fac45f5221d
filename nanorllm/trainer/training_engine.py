"""The training RolloutEngine of a config: what the serial loop, a pipeline worker and the benchmarks sample
with. The engine below takes only its specs (sampling, the env bundle, a row limit); reading them off the
config is this floor's job."""

from pathlib import Path

from nanorllm.config.specs import run_bundle, sampling_params
from nanorllm.envs.base import EnvBundle
from nanorllm.rollout.engine import RolloutEngine


def training_engine(policy, cfg, env: EnvBundle | None = None, *, pool_dir: Path | None = None) -> RolloutEngine:
    """The sampling engine every training rollout uses, serial or in a worker, on `env` (the run's bundle,
    built once by the assembly) or, without one, the bundle the config names. A game's model --opponent is loaded
    here, frozen, on the policy's device: each process that rolls out holds one; `--opponent pool` draws from the
    snapshots in `pool_dir` (<run>/pool, rollout/opponent_pool.py)."""
    env = run_bundle(cfg, env)
    return RolloutEngine(policy, sampling=sampling_params(cfg), env=env, max_batch_episodes=cfg.max_batch_episodes,
                         opponent_policy=opponent_model(policy, cfg, env, pool_dir=pool_dir))


def opponent_model(policy, cfg, env: EnvBundle, name: str | None = None, *, pool_dir: Path | None = None):
    """The frozen model `name` (default: --opponent) names, for a game, or the snapshot pool of `pool`
    (None: self, random, or a one-player env)."""
    from nanorllm.rollout.games import MODEL_FREE

    name = cfg.opponent if name is None else name
    if getattr(env, "seats", 1) == 1 or name in MODEL_FREE:
        return None
    if name == "pool":
        from nanorllm.rollout.opponent_pool import OpponentPool

        if pool_dir is None:
            raise ValueError("--opponent pool: this process has no run folder to read the snapshots from (another "
                             "node's workers: the pool is written on the learner's machine)")
        return OpponentPool(pool_dir, base=cfg.model, every=cfg.pool_every, size=cfg.pool_size,
                            load=lambda folder: frozen_model(policy, cfg, folder))
    from nanorllm.policy.chat_endpoint import ChatEndpointPolicy, is_endpoint

    if is_endpoint(name):
        return ChatEndpointPolicy(name)
    return frozen_model(policy, cfg, name)


def frozen_model(policy, cfg, name: str):
    """The model `name`, sampling only, never trained, on the policy's device (an API policy has none: the CPU)."""
    from nanorllm.policy.hf_causal import HFCausalPolicy

    device = str(getattr(policy, "device", "cpu"))
    model = HFCausalPolicy.from_name(name, device=device, dtype=cfg.dtype, replica=True, seed=cfg.seed)
    model.model.requires_grad_(False)
    model.graphs_enabled = getattr(cfg, "cuda_graphs", False)  # as the policy's (captured on first use)
    return model


def eval_opponent_name(cfg) -> str:
    """What --eval-opponent names: `base` is the model the run started from (--model)."""
    return cfg.model if cfg.eval_opponent == "base" else cfg.eval_opponent


def eval_opponent_model(policy, cfg, env: EnvBundle):
    """Held-out evaluation's frozen opponent model for a game (None: self, random, or a one-player env); ValueError
    for the snapshot pool, which moves with the policy."""
    from nanorllm.rollout.opponent_pool import NOT_FOR_EVAL

    if cfg.eval_opponent == "pool" and getattr(env, "seats", 1) > 1:
        raise ValueError(NOT_FOR_EVAL)
    return opponent_model(policy, cfg, env, name=eval_opponent_name(cfg))
