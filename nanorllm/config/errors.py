"""ConfigError: every problem of a config, one line each, raised once (exit code 2 where a run is started)."""

from pathlib import Path


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
    return ConfigError([f"{field}: cannot load {name!r}: {load_failure(name, error)}"], flag)


def load_failure(name: str, error: BaseException) -> str:
    """Why the model `name` did not load, in one line. A name with nothing at its path that cannot be a hub repo id
    either is named a missing path: the hub's complaint about the form of repo ids would be all the user read."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if Path(name).expanduser().exists():
        return first_line(error)
    try:
        validate_repo_id(name)
    except HFValidationError:
        return "no such file or folder (nor is it a hub repo id)"
    return first_line(error)
