"""ConfigError: every problem of a config, one line each, raised once (exit code 2 where a run is started)."""


class ConfigError(ValueError):
    def __init__(self, problems: list[str], source: str = "config"):
        self.problems = problems
        super().__init__(f"{len(problems)} problem(s) in {source}:\n" + "\n".join(f"  {p}" for p in problems))
