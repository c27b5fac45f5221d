"""ConfigError: every problem of a config, one line each, raised once (exit code 2 where a run is started)."""


class ConfigError(ValueError):
    def __init__(self, problems: list[str], source: str = "config"):
        self.problems = problems
        super().__init__(f"{len(problems)} problem(s) in {source}:\n" + "\n".join(f"  {p}" for p in problems))


def first_line(error: BaseException) -> str:
    """An error's first line (a library's message may run to pages), else its type's name."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def cannot_load(field: str, name: str, error: BaseException, flag: str) -> ConfigError:
    """A model that would not load (no such folder or hub id, a folder that needs its own code...), in one line
    naming the field."""
    return ConfigError([f"{field}: cannot load {name!r}: {first_line(error)}"], flag)
