"""A two-player test game that is not TextArena: Nim on one heap. The players take 1 or 2 stones in turn; whoever
takes the last stone wins (+1, the other -1). A move that is not "1" or "2" (or takes more stones than are left)
breaks the rules and that seat loses at once. `--env-arg lenient=true` reads any other text as taking
1 + its length mod 2 (so a random model's games run to their end). Tasks set the heap and who moves first."""

from nanorllm.envs.base import EnvBundle


class DuelEnv:
    def __init__(self, *, max_turns: int, lenient: bool):
        self.max_turns, self.lenient = max_turns, lenient

    def reset(self, task: dict) -> str:
        self.left, self.mover = int(task["heap"]), int(task.get("first", 0))
        return self.view()

    def view(self) -> str:
        return f"You are seat {self.mover}. {self.left} stones left. Take 1 or 2."

    def seat(self) -> int:
        return self.mover

    def legal_moves(self) -> list[str]:
        return [m for m in ("1", "2") if int(m) <= self.left]

    def step(self, move: str) -> tuple[str | None, float, bool, dict]:
        mover, take = self.mover, move.strip()
        if self.lenient and take not in ("1", "2"):
            take = str(min(1 + len(take) % 2, self.left))
        if take not in self.legal_moves():
            return None, 0.0, True, {"invalid_move": True, "rewards": self.rewards(winner=1 - mover),
                                     "reason": "invalid_move", "action": take}
        self.left -= int(take)
        if self.left == 0:
            return None, 0.0, True, {"rewards": self.rewards(winner=mover), "reason": "game_over", "action": take}
        self.mover = 1 - mover
        return self.view(), 0.0, False, {"action": take}

    @staticmethod
    def rewards(*, winner: int) -> list[float]:
        return [1.0 if seat == winner else -1.0 for seat in (0, 1)]


class Duel(EnvBundle):
    name = "duel"
    env_class = DuelEnv
    seats = 2
    system_prompt = "Play Nim: answer 1 or 2."
    args = {"lenient": False}
    default_tasks, default_eval_tasks = "duel:train", "duel:eval"

    def load_tasks(self, spec: str, *, limit: int | None = None) -> list[dict]:
        heaps = range(3, 5) if spec.endswith(":eval") else range(5, 13)
        tasks = [{"task_id": f"heap{h}", "heap": h, "game": "nim", "question": f"Nim, {h} stones"} for h in heaps]
        return tasks[:limit]
