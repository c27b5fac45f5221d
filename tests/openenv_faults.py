"""OpenEnv environments that misbehave on some seeds, for the fault tests of tests/test_openenv.py (importable by a
run's own processes): slow past --env-timeout-s, or an observation without its text."""

import threading

from openenv.core.env_server import Observation

from tests.openenv_example import GuessAction, GuessEnv, GuessObservation

SLOW_S = 3.0


class MaybeTextObservation(Observation):
    text: str | None = ""


class SlowGuessEnv(GuessEnv):
    """GuessEnv whose first step on an even seed takes `slow_s` seconds, or until `released` is set; `slow_steps`
    counts those steps that returned."""

    slow_s, released, slow_steps = SLOW_S, threading.Event(), 0

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.slow = seed is not None and seed % 2 == 0
        return super().reset(seed=seed, episode_id=episode_id)

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        if self.slow and self._state.step_count == 0:
            self.released.wait(self.slow_s)
            SlowGuessEnv.slow_steps += 1
        return super().step(action)


class TextlessGuessEnv(GuessEnv):
    """GuessEnv whose observations after a wrong guess on an odd seed have no text (null)."""

    def reset(self, seed=None, episode_id=None, **kwargs) -> MaybeTextObservation:
        self.odd = seed is not None and seed % 2 == 1
        return MaybeTextObservation(text=super().reset(seed=seed, episode_id=episode_id).text)

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> MaybeTextObservation:
        obs = super().step(action)
        return MaybeTextObservation(text=None if self.odd and not obs.done else obs.text, reward=obs.reward,
                                    done=obs.done)


class NanRewardGuessEnv(GuessEnv):
    """GuessEnv whose last step on an odd seed scores nan (OpenEnv's server sends it as null), else 1."""

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.odd = seed is not None and seed % 2 == 1
        return super().reset(seed=seed, episode_id=episode_id)

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        return GuessObservation(text="Scored.", reward=float("nan") if self.odd else 1.0, done=True)


class SeedBlindEnv(GuessEnv):
    """OpenEnv's ReasoningGymEnvironment's way: without `dataset_name` the reset ignores the seed (one question for
    every task); with it, the seed picks the question."""

    def reset(self, seed=None, episode_id=None, dataset_name=None, **kwargs) -> GuessObservation:
        super().reset(seed=seed, episode_id=episode_id)
        if dataset_name is None:
            return GuessObservation(text="What is 1 + 1?")
        return GuessObservation(text=f"[{dataset_name}] What is {seed} + {self.target}?")
