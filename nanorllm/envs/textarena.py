"""TextArena games as multi-turn episodes (`--env textarena:GAME-ID`): single-player games (GuessTheNumber-v0) and
two-player games (TicTacToe-v0, KuhnPoker-v0, SimpleNegotiation-v0, ...) the policy plays against itself or an opponent.

One episode is one game: `reset(task)` makes the game (`textarena.make(GAME-ID)`) and starts it with the
task's seed; the game's messages since the model's last move are the user turn, the model's reply is the move
(through the game's own action wrappers), and the game's final reward for player 0 is the episode's reward,
given on the step that ends it. The game judges its moves: an invalid move is the game's feedback or its
penalty reward, never a crash. An exception the game raises ends that episode as an env error (the engine's
rule for any env). The episode ends when the game is done ("game_over", or "invalid_move" when an invalid move
ended it) or at --max-turns ("max_turns", reward 0 unless the game had already set one); the game is closed
either way, and when it raises. Its success (info "success") is a win: the game ended it with its full reward,
1 (many games give a partial reward when they end otherwise).

A two-player game is a game in the env protocol's sense (envs/base.py; rollout/games.py plays it): `seats = 2`,
`seat()` is the game's current player id, `reset` and `step` give the next mover's new messages, and the finished
game's rewards (TextArena's: +1 / -1 / 0, and -1 for the seat whose invalid move ended it) are info["rewards"].
`legal_moves()` reads the moves a game lists (`LEGAL_MOVES`: TicTacToe and KuhnPoker so far), what
`--opponent random` draws from; a game it cannot read is refused with that opponent. The game's own turn limit
stands; the run's `--max-turns` bounds each seat's turns (rollout/games.py).

Tasks are seeds: `ta:count=N,seed=S` is the seeds S .. S+N-1. Training and held-out seeds come from disjoint
ranges (`default_tasks` / `default_eval_tasks`, envs/seeds.py). A game for more than two players is refused.
"""

import contextlib
import difflib
import random
from typing import ClassVar

from nanorllm.core.types import RolloutResult
from nanorllm.envs.base import EnvBundle
from nanorllm.envs.seeds import EVAL_SEEDS, TRAIN_SEEDS, parse_seed_spec, seed_spec
from nanorllm.utils.modules import EnvSpecError

SYSTEM_PROMPT = ("You are playing a text game. Read the game's rules and messages, then reply with your move "
                 "in the format the game asks for.")
NO_MESSAGE = "(The game sent no message. Make your next move.)"


def registry() -> dict:
    import textarena

    return textarena.envs.registration.ENV_REGISTRY


def innermost(game):
    """The game under its wrappers: its observations are read there, one turn's new messages at a time."""
    import textarena

    while isinstance(game, textarena.Wrapper):
        game = game.env
    return game


def messages_text(observation, seat: int = 0) -> str:
    """The game's new messages as one text, leaving out the seat's own moves (already its assistant turns)."""
    import textarena

    if isinstance(observation, str):
        return observation.strip()
    lines = [str(message).strip() for sender, message, kind in observation
             if not (sender == seat and kind == textarena.ObservationType.PLAYER_ACTION)]
    return "\n\n".join(line for line in lines if line)


def next_messages(game) -> str:
    """What the player to move has not seen yet, as text."""
    seat, observation = innermost(game).get_observation()
    return messages_text(observation, seat)


class GameRandom:
    """One game's own stream of the module-level `random`, which TextArena's games draw from: seeded at reset, and
    drawn at step time too (KuhnPoker deals every round with `random.shuffle`). Shared, the stream would make a
    game's later deals depend on every other game played at once and on the trainer's own draws: a held-out game
    would not be its seed's, and two evaluations of one model would deal different cards. Each call into the game
    runs with its stream swapped in (`active`), and the trainer's put back after it. One thread plays the games."""

    def __init__(self, seed: int):
        self.state = random.Random(seed).getstate()

    @contextlib.contextmanager
    def active(self):
        saved = random.getstate()
        random.setstate(self.state)
        try:
            yield
        finally:
            self.state = random.getstate()
            random.setstate(saved)


def start_game(game_id: str, seed: int, players: int = 1, stream: GameRandom | None = None):
    """A game made and started with `seed` in `stream` (its own `random` stream, for its later calls; a new one when
    not given), its first mover's observation's text. The trainer's own `random` stream is left as it was."""
    import textarena

    with (stream or GameRandom(seed)).active():
        game = textarena.make(game_id)
        game.reset(num_players=players, seed=seed)
        return game, next_messages(game)


def tictactoe_moves(state) -> list[str]:
    board = state.game_state["board"]
    return [f"[{r * 3 + c}]" for r in range(3) for c in range(3) if board[r][c] == ""]


def kuhn_poker_moves(state) -> list[str]:
    tree = state.game_state.get("current_legal_action_tree")
    return [f"[{k}]" for k in tree] if isinstance(tree, dict) else []


LEGAL_MOVES = {"TicTacToeEnv": tictactoe_moves, "KuhnPokerEnv": kuhn_poker_moves}  # by the game's class name


class TextArenaEnv:
    """One game of `game_id` per episode (see the module docstring)."""

    def __init__(self, *, game_id: str, max_turns: int = 10):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.game_id, self.max_turns = game_id, max_turns
        self.players = 1
        self.game = None
        self.random: GameRandom | None = None  # the game's own `random` stream
        self.turn = 0
        self.closed = True
        self.rewards: dict | None = None
        self.game_info: dict | None = None

    def reset(self, task: dict) -> str:
        self.close()
        self.random = GameRandom(int(task["seed"]))
        self.game, observation = start_game(self.game_id, int(task["seed"]), self.players, self.random)
        self.turn, self.closed = 0, False
        return observation or NO_MESSAGE

    def close(self) -> tuple[dict | None, dict | None]:
        """The game's (rewards, game_info), closing it the first time only."""
        if self.game is not None and not self.closed:
            self.closed = True
            with self.random.active():
                self.rewards, self.game_info = self.game.close()
        return self.rewards, self.game_info

    def game_step(self, response: str) -> bool:
        """The game's own step in its own `random` stream; whether the game is done. A game that raises is closed."""
        try:
            with self.random.active():
                done, _ = self.game.step(response)
        except BaseException:
            self.close()
            raise
        return done

    def step(self, response: str) -> tuple[str | None, float, bool, dict]:
        assert self.game is not None and not self.closed, "call reset(task) first"
        self.turn += 1
        state = innermost(self.game).state
        errors_before = getattr(state, "error_count", 0)
        done = self.game_step(response)
        invalid = getattr(state, "error_count", 0) > errors_before
        info = {"turn": self.turn, "invalid_move": invalid}
        if not done and self.turn < self.max_turns:
            return messages_text(innermost(self.game).get_observation()[1]) or NO_MESSAGE, 0.0, False, info
        rewards, game_info = self.close()
        player = (game_info or {}).get(0, {})
        reward = float((rewards or {}).get(0, 0.0))
        if done:
            info["invalid_move"] = invalid or bool(player.get("invalid_move"))
            reason = "invalid_move" if player.get("invalid_move") else "game_over"
        else:
            reason = "max_turns"
        return None, reward, True, {**info, "game_done": bool(done), "game_reason": str(player.get("reason", "")),
                                    "reason": reason, "success": bool(done) and reward >= 1.0}  # won


class TwoPlayerEnv(TextArenaEnv):
    """One game of a two-player `game_id` per episode: a game in the env protocol's sense (see the module docstring).
    Its turn cap is the game's own; the run's --max-turns bounds each seat's turns (rollout/games.py)."""

    def __init__(self, *, game_id: str, max_turns: int = 10):
        super().__init__(game_id=game_id, max_turns=max_turns)
        self.players = 2

    def seat(self) -> int:
        return int(innermost(self.game).state.current_player_id)

    def legal_moves(self) -> list[str] | None:
        read = LEGAL_MOVES.get(type(innermost(self.game)).__name__)
        return None if read is None else read(innermost(self.game).state)

    def step(self, response: str) -> tuple[str | None, float, bool, dict]:
        assert self.game is not None and not self.closed, "call reset(task) first"
        self.turn += 1
        state = innermost(self.game).state
        mover, errors_before = self.seat(), getattr(state, "error_count", 0)
        done = self.game_step(response)
        info = {"turn": self.turn, "invalid_move": getattr(state, "error_count", 0) > errors_before}
        if not done:
            return next_messages(self.game) or NO_MESSAGE, 0.0, False, info
        rewards, game_info = self.close()
        seats = [(game_info or {}).get(k, {}) for k in range(self.players)]
        broke = [k for k, player in enumerate(seats) if player.get("invalid_move")]
        info["invalid_move"] = info["invalid_move"] or mover in broke
        return None, 0.0, True, {**info, "rewards": [float((rewards or {}).get(k, 0.0)) for k in range(self.players)],
                                 "game_done": True, "game_reason": str(seats[mover].get("reason", "")),
                                 "reason": "invalid_move" if broke else "game_over"}


class TextArenaGame(EnvBundle):
    """A TextArena game; `bundle_class` sets `game_id` (and `seats` for a two-player game)."""

    game_id: ClassVar[str] = ""
    opening: ClassVar[str] = ""  # the game's first observation on seed 0: what the prompt-size checks measure
    system_prompt = SYSTEM_PROMPT
    default_tasks = seed_spec("ta", TRAIN_SEEDS)
    default_eval_tasks = seed_spec("ta", EVAL_SEEDS)

    def __init__(self, settings=None, **options):
        super().__init__(settings, **options)
        if "random" in (self.settings.opponent, self.settings.eval_opponent) and self.seats > 1:
            env = self.make_env()
            env.reset({"task_id": "check", "seed": 0})
            moves = env.legal_moves()
            env.close()
            if moves is None:
                flag = "--opponent" if self.settings.opponent == "random" else "--eval-opponent"
                raise EnvSpecError(f"{flag} random: {self.name} lists no legal moves this adapter can read "
                                   f"(it reads them for {', '.join(k.removesuffix('Env') for k in LEGAL_MOVES)}); "
                                   f"use {flag} self")

    def make_env(self) -> TextArenaEnv:
        env_class = TwoPlayerEnv if self.seats > 1 else TextArenaEnv
        # a game's turn cap is the game's own, the run's --max-turns bounds each seat's turns (rollout/games.py)
        return env_class(game_id=self.game_id, max_turns=self.settings.max_turns * self.seats)

    def load_tasks(self, spec: str, *, limit: int | None = None) -> list[dict]:
        if spec != "ta" and not spec.startswith("ta:"):
            raise ValueError(f"{spec!r}: textarena tasks are seeds, ta:count=N,seed=S")
        first, count = parse_seed_spec(spec)
        count = count if limit is None else min(count, limit)
        return [{"task_id": f"{self.game_id}-seed{s}", "seed": s, "game": self.game_id,
                 "question": f"{self.opening}\n\n[{self.game_id} seed {s}]"} for s in range(first, first + count)]

    def metrics(self, results: list[RolloutResult]) -> dict:
        """Turns and invalid moves per episode; episodes the game itself ended, those an invalid move ended, and
        those it ended with its full reward (1: won; many games give partial rewards when they end otherwise)."""
        n = max(len(results), 1)
        last = [r.trajectory.steps[-1].info if r.trajectory.steps else {} for r in results]
        return {"textarena/turns_per_episode": sum(r.trajectory.num_turns for r in results) / n,
                "textarena/invalid_moves_per_episode": sum(bool(s.info.get("invalid_move")) for r in results
                                                           for s in r.trajectory.steps) / n,
                "textarena/games_finished": sum(bool(i.get("game_done")) for i in last) / n,
                "textarena/ended_by_invalid_move": sum(i.get("reason") == "invalid_move" for i in last) / n,
                "textarena/won": sum(bool(i.get("success")) for i in last) / n}


def bundle_class(target: str) -> type[EnvBundle]:
    """The bundle of `--env textarena:GAME-ID`, refused at start when the id is unknown, the game needs more
    than two players, or it cannot start."""
    spec = f"textarena:{target}"
    ids = registry()
    if target not in ids:
        close = difflib.get_close_matches(target, list(ids), n=5, cutoff=0.5)
        hint = f"closest: {', '.join(close)}" if close else "see textarena.envs.registration.ENV_REGISTRY"
        raise EnvSpecError(f"{spec!r}: no TextArena game {target!r} ({hint})")
    players, opening = players_of(spec, target)
    return type(f"TextArena_{''.join(c if c.isalnum() else '_' for c in target)}", (TextArenaGame,),
                {"name": f"textarena:{target}", "game_id": target, "opening": opening, "seats": players,
                 "__module__": __name__})


def players_of(spec: str, target: str) -> tuple[int, str]:
    """(1 or 2 players, the first mover's opening on seed 0): the game started for one player, else for two;
    refused when it takes neither (a game for more players names its count) or cannot start."""
    for players in (1, 2):
        try:
            game, opening = start_game(target, 0, players)
            game.close()
            return players, opening
        except AssertionError as e:
            if "player" in str(e).lower():
                why = e
                continue
            raise EnvSpecError(f"{spec!r}: {target} cannot start: AssertionError: {e}") from None
        except Exception as e:
            first = next((line.strip() for line in str(e).splitlines() if line.strip().strip("*")), "")
            raise EnvSpecError(f"{spec!r}: {target} cannot start: {type(e).__name__}: {first}") from None
    raise EnvSpecError(f"{spec!r}: {target} is a game for more than two players ({why}); self-play here plays "
                       "one- and two-player games")
