"""An OpenEnv environment: guess a number from 1 to 10, told "higher" or "lower" after each wrong guess.

Train on it with `python launch/train.py --env openenv:tests/openenv_example.py:GuessEnv --max-turns 4`: the run
serves it on 127.0.0.1 with OpenEnv's own server. The number comes from the reset's seed; a right guess ends the
episode with reward 1.
"""

import random
import re

from openenv.core.env_server import Action, Environment, Observation, State

LOW, HIGH = 1, 10


class GuessAction(Action):
    guess: str  # the model's reply: its last whole number is the guess


class GuessObservation(Observation):
    text: str = ""


class GuessEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has an instance of its own, and instances share nothing

    def __init__(self):
        super().__init__()
        self._state = State()
        self.target = LOW

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs) -> GuessObservation:
        self.target = random.Random(seed).randint(LOW, HIGH)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(text=f"I am thinking of a number from {LOW} to {HIGH}. Reply with your guess.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs) -> GuessObservation:
        self._state.step_count += 1
        numbers = re.findall(r"-?\d+", action.guess)
        if not numbers:
            return GuessObservation(text=f"Reply with a whole number from {LOW} to {HIGH}.", reward=0.0)
        guess = int(numbers[-1])
        if guess == self.target:
            return GuessObservation(text="Correct!", reward=1.0, done=True)
        return GuessObservation(text=f"{guess} is wrong: the number is {'higher' if guess < self.target else 'lower'}.",
                                reward=0.0)

    @property
    def state(self) -> State:
        return self._state
