"""Games: episodes whose env several players share, each seat played by the policy or by an opponent (self-play).

Why apart from engine.py: a one-player episode is one agent, one row and one turn after another; a game is one env
and a seat per player, whose turns alternate. Each seat the policy plays keeps its own agent (its own messages: what
that player was shown and said), its own token row and its own StepSamples, and ends as its own RolloutResult
(`seat` set) with its own reward: its steps' rewards plus its final reward from the game (info["rewards"],
envs/base.py).
Only the policy's seats train; the engine's opponent (`--opponent`; held-out evaluation's `--eval-opponent`) says
who plays the rest:
- "self": the policy plays every seat (SPIRAL's and TextArena's self-play); every seat trains;
- "random": a uniformly random move of `env.legal_moves()`; the policy plays one seat of each game, turn about over
  a task's games (`policy_seats`), so a task's games cover every seat;
- a model (the engine's `opponent_policy`, loaded frozen by trainer/training_engine.py): it plays the other seats as the
  policy plays its own, in a decode batch of its own beside the policy's; its turns never train. An API model (an
  OpenAI-compatible endpoint, policy/chat_endpoint.py) answers a step's waiting turns in one `generate` call between
  the policy's decode steps; a call that fails ends its games as env errors;
- "pool": the policy's own earlier snapshots (rollout/opponent_pool.py, the engine's `opponent_policy`): each game's
  other seats are played by one of them, as a model opponent's, each snapshot in a decode batch of its own.

The decode batch holds the next turn of every live game at once: a seat's turn joins it when the game is its move
(the opponents' moves in between are played at once), so many games keep the batch full though each game's turns
alternate. A seat holds no KV slot while the others move: its next turn joins from the shared prompt prefix and
prefills its own history again (games are short; a slot per seat would double the cache the memory plan sizes).
Each seat draws its own sampling stream in game order (the episodes' rule, engine.py), a model opponent from its own
generator seeded by the call's seed and the opponent's name, and the random opponent its own `random.Random` of
(seed, game): a fixed seed plays the same games serial or in the pipeline, on any worker and after a resume.

A game ends when the env says done, when its mover has had `--max-turns` turns ("max_turns": each seat's rewards so
far, a draw), when a seat's next turn would pass the row's bound ("truncated"), or when the env raises or breaks
the protocol: every policy seat of it then ends as an env error (left out of its group, counted in
rollout/env_errors). A policy seat the game ended before it ever moved (its opponent lost on invalid moves first)
has nothing to train on and returns no episode; its seat and final reward go to the call's `unplayed`, which
held-out evaluation counts as a game played (trainer/evaluate.py).
"""

import contextlib
import random
import time
import zlib
from collections import deque
from dataclasses import dataclass, field

from nanorllm.core.types import RolloutResult, StepSample, Trajectory, Unplayed, ending
from nanorllm.envs.base import Agent, EnvProtocolError, check_reset, check_step
from nanorllm.policy.base import SamplingParams
from nanorllm.policy.slot_batch import new_stats
from nanorllm.rollout.opponent_pool import PREFIX, pick
from nanorllm.utils.faults import env_response

MODEL_FREE = ("self", "random")  # opponents that need no model beside the policy
OPPONENTS = (*MODEL_FREE, "pool")  # the named ones; any other name is a model
NO_MESSAGE = "(No new message. Make your move.)"
MOVE_KEYS = ("action", "extracted", "invalid_move", "turn")  # a step's info about its move, not about the game


@dataclass
class SeatPlay:
    """One seat of one game, played by a model: the policy (its turns train) or a model opponent (they do not)."""

    game: "Game"
    seat: int
    episode_id: str
    agent: Agent
    model: object  # the policy, or the opponent model
    trains: bool = True
    rng: object = None
    prompt_ids: list[int] = field(default_factory=list)
    samples: list[StepSample] = field(default_factory=list)
    pending: tuple[float, dict] = (0.0, {})  # its last move's reward and info: told at its next turn, or at the end
    response_ids: list[int] = field(default_factory=list)  # its last turn's
    n_messages: int = 0  # its agent's messages up to its last response


@dataclass
class Game:
    task: dict
    group_id: str
    index: int  # the task's k-th game
    task_index: int
    env: object
    opponent: object = None  # the model that plays its other seats (None: the policy itself, or random moves)
    opponent_name: str = ""  # what the game's episodes record as their opponent
    plays: dict[int, SeatPlay] = field(default_factory=dict)  # the seats a model plays
    rng: random.Random | None = None  # the random opponent's
    results: list[RolloutResult] = field(default_factory=list)


@dataclass
class Lane:
    """One model's decode batch (None: an API model, answered by `generate`) and the seats waiting for it."""

    model: object
    batch: object
    waiting: deque = field(default_factory=deque)
    start: object = None  # the shared prompt prefix its first joiners computed once

    def live(self) -> bool:
        return self.batch is not None and len(self.batch) > 0

    def join(self, most: int, shared_prefix, min_shared: int) -> None:
        """Waiting seats join up to `most` rows; the first joiners' shared prefix is computed once, for all."""
        joining = [self.waiting.popleft() for _ in range(min(most - len(self.batch), len(self.waiting)))]
        if self.start is None and len(joining) > 1:
            shared = shared_prefix([p.prompt_ids for p in joining])
            self.start = self.batch.cache_prefix(shared) if len(shared) >= min_shared else False
        self.batch.join([(p, p.prompt_ids, p.rng, self.start or None) for p in joining])


class GameError(Exception):
    """The env raised, or broke the game protocol: the game ends as an env error."""


def policy_seats(opponent: str, seats: int, task_id: str, index: int) -> list[int]:
    """The seats the policy plays in a task's `index`-th game: all of them against itself, else one, turn about from
    a seat the task id picks (so one game a task, as evaluation plays, still covers every seat over the tasks)."""
    return list(range(seats)) if opponent == "self" else [(index + zlib.crc32(task_id.encode())) % seats]


def final_rewards(info: dict, seats: int) -> list[float]:
    """info["rewards"] of a finished game: one finite number per seat (missing: all 0, a draw)."""
    rewards = info.get("rewards")
    if rewards is None:
        return [0.0] * seats
    if not isinstance(rewards, (list, tuple)) or len(rewards) != seats:
        raise EnvProtocolError("info['rewards']", f"a list of {seats} numbers, one per seat", rewards)
    return [check_step((None, r, True, {}))[1] for r in rewards]


def outcome(reward: float) -> str:
    """A seat's result in a zero-sum game: its final reward's sign."""
    return "win" if reward > 0 else "loss" if reward < 0 else "draw"


class GameRunner:
    """Plays one engine call's games (RolloutEngine.run hands a bundle with seats > 1 here)."""

    def __init__(self, engine, *, shared_prefix, min_shared: int, report_error):
        """The engine's own rules, handed down as AgentRunner's are: `shared_prefix(prompts)` (the prefix first prompts
        share, computed once, used from `min_shared` tokens) and `report_error(spec, task_id, where)` (an env error,
        printed once per kind)."""
        self.engine, self.policy, self.bundle = engine, engine.policy, engine.env
        self.shared_prefix, self.min_shared, self.report_error = shared_prefix, min_shared, report_error
        self.seats, self.opponent = engine.env.seats, engine.opponent
        self.opponent_policy = engine.opponent_policy if self.opponent not in OPPONENTS else None
        self.pool = engine.opponent_policy if self.opponent == "pool" else None
        self.params = engine.sampling
        self.unplayed: list[Unplayed] = []

    def run(self, tasks: list[dict], num_samples: int, group_ids: list[str], params: SamplingParams,
            seed: int | None) -> tuple[list[RolloutResult], int, float, dict]:
        """(the policy seats' episodes in task, game, seat order; tokens generated; generate seconds; counters)."""
        self.params = params
        members = self.pool.members(getattr(self.policy, "version", 0)) if self.pool is not None else []
        games = []
        for i, (task, gid) in enumerate(zip(tasks, group_ids)):
            for k in range(num_samples):
                game = Game(task=task, group_id=gid, index=k, task_index=i, env=self.bundle.make_env(),
                            rng=random.Random(f"{seed or 0}:{gid}#{k}"), opponent=self.opponent_policy,
                            opponent_name=self.opponent)
                if members:
                    step, game.opponent = members[pick(len(members), gid, k)]
                    game.opponent_name = f"pool:{PREFIX}{step}"
                mine = policy_seats(self.opponent, self.seats, task["task_id"], k)
                game.plays = {s: self.seat_play(game, s, gid, k, trains=s in mine) for s in range(self.seats)
                              if s in mine or game.opponent is not None}
                games.append(game)
        models = list({id(p.model): p.model for g in games for p in g.plays.values()}.values())
        models = [self.policy] + [m for m in models if m is not self.policy]
        names = {id(g.opponent): g.opponent_name for g in games}
        for model in models:
            if model is not self.policy and seed is not None:  # an opponent's streams: the call's seed and its name,
                model.seed(zlib.crc32(f"{seed}:{names[id(model)]}".encode()))  # whichever process plays the call
            plays = [p for g in games for p in g.plays.values() if p.model is model]
            if hasattr(model, "row_generators"):  # each model's own streams, drawn in game order
                for p, rng in zip(plays, model.row_generators(len(plays))):
                    p.rng = rng
        ready = deque(p for p in map(self.start, games) if p is not None)
        if not ready:
            n_generated, gen_s, stats = 0, 0.0, {}
        elif hasattr(self.policy, "decode_batch"):
            n_generated, gen_s, stats = self.in_flight(ready, models)
        else:
            n_generated, gen_s, stats = self.turn_by_turn(ready)
        return [r for g in games for r in g.results], n_generated, gen_s, stats

    def seat_play(self, game: Game, seat: int, group_id: str, k: int, *, trains: bool) -> SeatPlay:
        return SeatPlay(game=game, seat=seat, episode_id=f"{group_id}#{k}/seat{seat}", agent=self.bundle.make_agent(),
                        model=self.policy if trains else game.opponent, trains=trains)

    # ---- the decode loops -------------------------------------------------------------------
    def in_flight(self, ready: deque, models: list) -> tuple[int, float, dict]:
        """Every live game's next turn in one running decode batch per model of `models` (the policy's first; a
        model opponent's, each pool snapshot's); the counters and tokens are the policy's."""
        engine, n_generated, stats = self.engine, 0, new_stats()
        t0 = time.perf_counter()
        rows = min(engine.max_batch_episodes, len(ready))  # a game has one turn in a batch at a time
        width = engine.slot_width(max(len(p.prompt_ids) for p in ready), self.params)
        with contextlib.ExitStack() as stack:
            lanes = [Lane(m, stack.enter_context(m.decode_batch(self.params, stats=stats if m is self.policy else None,
                                                                slots=rows + 1, width=width))
                          if hasattr(m, "decode_batch") else None) for m in models]  # None: an API model
            for play in ready:
                lanes[models.index(play.model)].waiting.append(play)
            while any(lane.waiting or lane.live() for lane in lanes):
                for lane in lanes:
                    if lane.batch is not None:
                        lane.join(engine.max_batch_episodes, self.shared_prefix, self.min_shared)
                engine.on_step()
                done = []
                for lane in lanes:
                    if lane.batch is None:  # an API model: its waiting turns in one call
                        done += self.generate(lane.model, list(lane.waiting))
                        lane.waiting.clear()
                        continue
                    for play, gen, state in lane.batch.step() if len(lane.batch) else ():
                        lane.batch.release(state)  # the seat holds no slot while the others move
                        done.append((play, gen))
                for play, gen in done:
                    n_generated += len(gen.response_ids) if play.model is self.policy else 0
                    if (nxt := self.move(play, gen)) is not None:
                        lanes[models.index(nxt.model)].waiting.append(nxt)
        return n_generated, time.perf_counter() - t0, stats

    def turn_by_turn(self, ready: deque) -> tuple[int, float, dict]:
        """A policy with `generate` alone (an API model): the ready turns in chunks of max_batch_episodes."""
        n_generated, gen_s = 0, 0.0
        while ready:
            model = ready[0].model  # a chunk is one model's turns, in the order they came
            chunk = [p for p in ready if p.model is model][:self.engine.max_batch_episodes]
            for play in chunk:
                ready.remove(play)
            t0 = time.perf_counter()
            answered = self.generate(model, chunk)
            gen_s += time.perf_counter() - t0 if model is self.policy else 0.0
            for play, gen in answered:
                n_generated += len(gen.response_ids) if model is self.policy else 0
                if (nxt := self.move(play, gen)) is not None:
                    ready.append(nxt)
        return n_generated, gen_s, {}

    def generate(self, model, plays: list[SeatPlay]) -> list[tuple[SeatPlay, object]]:
        """One `generate` call for `plays` (one model's turns): (play, its Generation). A model opponent's call that
        raises (an endpoint that does not answer) ends those games as env errors; the policy's raises on."""
        if not plays:
            return []
        try:
            gens = model.generate([p.agent.messages for p in plays], [p.prompt_ids for p in plays], self.params)
        except Exception:
            if model is self.policy:
                raise
            for play in plays:
                try:
                    self.fail(play.game, "opponent")
                except GameError:
                    pass
            return []
        return list(zip(plays, gens))

    # ---- a game's moves ---------------------------------------------------------------------
    def start(self, game: Game) -> SeatPlay | None:
        """Reset the game and play up to the policy's first turn (None: the game already ended)."""
        try:
            observation = self.env_call(game, "reset", lambda: check_reset(game.env.reset(game.task)))
            observation = observation if isinstance(observation, str) else observation["question"]
            return self.next_turn(game, observation, False, {})
        except GameError:
            return None

    def move(self, play: SeatPlay, gen) -> SeatPlay | None:
        """A seat's response played; the next model turn of its game (None: the game ended)."""
        game, agent = play.game, play.agent
        agent.update_from_model(gen.text)
        play.samples.append(StepSample(
            task_id=game.task["task_id"], episode_id=play.episode_id, turn=len(play.samples),
            prompt_ids=play.prompt_ids, response_ids=gen.response_ids, rollout_logprobs=gen.logprobs,
            policy_version=getattr(play.model, "version", 0), truncated=gen.truncated))
        play.response_ids, play.n_messages = gen.response_ids, len(agent.messages)
        try:
            observation, reward, done, info = self.env_call(game, "step",
                                                            lambda: check_step(game.env.step(env_response(gen.text))))
            play.pending = (reward, info)
            return self.next_turn(game, observation, done, info)
        except GameError:
            return None

    def next_turn(self, game: Game, observation: str | None, done: bool, info: dict) -> SeatPlay | None:
        """Play the random opponent's moves until a model's seat is to move (returned, its prompt ready) or the game
        ends."""
        while not done:
            seat = self.env_call(game, "seat", lambda: self.mover(game))
            play = game.plays.get(seat)
            if play is None:
                observation, _, done, info = self.env_call(game, "step", lambda: check_step(
                    game.env.step(self.opponent_move(game))))
                continue
            if len(play.samples) >= self.engine.max_turns:
                self.end(game, reason="max_turns", info={})
                return None
            if not self.open_turn(play, observation or NO_MESSAGE):
                self.end(game, reason="truncated", info={"context_overflow": True})
                return None
            return play
        self.end(game, reason=None, info=info)
        return None

    def mover(self, game: Game) -> int:
        """env.seat(), checked: a seat of this game."""
        seat = game.env.seat()
        if isinstance(seat, bool) or not isinstance(seat, int) or not 0 <= seat < self.seats:
            raise EnvProtocolError("env.seat()", f"a seat 0..{self.seats - 1}", seat)
        return seat

    def opponent_move(self, game: Game) -> str:
        """--opponent random: one of the game's legal moves, drawn from the game's own stream."""
        moves = game.env.legal_moves() if hasattr(game.env, "legal_moves") else None
        if not moves:
            raise EnvProtocolError("env.legal_moves()", "a non-empty list of moves (--opponent random plays one)",
                                   moves)
        return game.rng.choice(list(moves))

    def open_turn(self, play: SeatPlay, observation: str) -> bool:
        """Show the seat what it has not seen and make its turn's prompt; False if the row would pass its bound."""
        agent = play.agent
        if agent.trajectory is None:
            agent.reset(play.game.task, observation)
            play.prompt_ids = play.model.first_prompt_ids(agent.messages, getattr(agent, "tools", None))
            return True
        reward, info = play.pending
        n_steps = len(agent.trajectory.steps)
        agent.update_from_env(observation, reward, False, info)
        prompt_ids = play.model.next_prompt_ids(play.prompt_ids, play.response_ids, agent.messages[play.n_messages:],
                                                getattr(agent, "tools", None))
        bound = self.engine.row_tokens
        if bound is not None and len(prompt_ids) + self.params.max_new_tokens > bound:
            del agent.messages[play.n_messages:], agent.trajectory.steps[n_steps:]
            play.pending = (reward, {**info, "context_overflow": True})
            return False
        play.prompt_ids = prompt_ids
        return True

    def end(self, game: Game, *, reason: str | None, info: dict) -> None:
        """Every policy seat that moved ends with its steps' rewards and its final one (`reason` None: the game
        itself ended it, with its info's reason)."""
        finals = self.env_call(game, "step", lambda: final_rewards(info, self.seats)) if reason is None \
            else [0.0] * self.seats
        self.close(game)
        for seat, play in game.plays.items():
            if not play.samples:
                if play.trains:
                    self.unplayed.append(Unplayed(seat, finals[seat], game.task["task_id"]))
                continue
            last_reward, last_info = play.pending
            said = {"seat": seat, "outcome": outcome(finals[seat]), "success": finals[seat] > 0}  # a win
            game_level = {k: v for k, v in info.items() if k not in MOVE_KEYS}  # the mover's own are in its pending
            play.agent.update_from_env(None, last_reward + finals[seat], True, {**last_info, **game_level, **said})
            total = sum(s.reward for s in play.agent.trajectory.steps)
            why = ending(info.get("reason"), total, cut=play.samples[-1].truncated, otherwise="game_over") \
                if reason is None else reason
            traj = play.agent.finish(total, terminated=reason is None, reason=why)
            self.keep(game, play, traj)

    def fail(self, game: Game, where: str) -> None:
        """Inside an `except`: the env raised, or broke the protocol. Every policy seat of the game ends as an env
        error (the error printed once per kind); raises GameError."""
        text = self.report_error(self.bundle.spec, game.task["task_id"], where)
        self.close(game)
        for seat, play in game.plays.items():
            if play.agent.trajectory is None:
                traj = Trajectory(task_id=game.task["task_id"], task=dict(game.task))
            else:
                traj = play.agent.trajectory
                traj.steps[-1].info["error"] = text
            traj.termination_reason = "error"
            self.keep(game, play, traj)
        raise GameError(where)

    def keep(self, game: Game, play: SeatPlay, traj: Trajectory) -> None:
        """A policy seat's episode, kept as the game's result (a model opponent's seat trains nothing: left out)."""
        if not play.trains:
            return
        for s in play.samples:
            s.reward = traj.final_reward
        game.results.append(RolloutResult(trajectory=traj, step_samples=play.samples, group_id=game.group_id,
                                          seat=play.seat, opponent=game.opponent_name))

    def env_call(self, game: Game, where: str, call):
        """`call()` heard as "grading" by the hang watch; an exception ends the game as an env error."""
        self.engine.watch("grading", game.task_index)
        try:
            return call()
        except GameError:
            raise
        except Exception:
            self.fail(game, where)
        finally:
            self.engine.watch("generating", -1)

    @staticmethod
    def close(game: Game) -> None:
        close = getattr(game.env, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # a game that cannot close has still ended
                pass
