"""Every name the package, the launch scripts and the tests use is defined: pyflakes' undefined-name check over
each file. A name a refactor moved away fails here, not in the one command that reaches it (a benchmark's last
line, an error path)."""

from pathlib import Path

from pyflakes import api, messages
from pyflakes.reporter import Reporter

ROOT = Path(__file__).resolve().parents[1]


class Undefined(Reporter):
    """Keeps the undefined names and syntax errors; the style findings (unused imports) are not this test's."""

    def __init__(self):
        self.found: list[str] = []

    def flake(self, message) -> None:
        if isinstance(message, (messages.UndefinedName, messages.UndefinedExport, messages.UndefinedLocal)):
            self.found.append(str(message))

    def syntaxError(self, filename, msg, lineno, offset, text) -> None:
        self.found.append(f"{filename}:{lineno}: {msg}")

    def unexpectedError(self, filename, msg) -> None:
        self.found.append(f"{filename}: {msg}")


def undefined_names(paths: list[Path]) -> list[str]:
    reporter = Undefined()
    for path in paths:
        api.checkPath(str(path), reporter)
    return reporter.found


def test_the_check_sees_an_undefined_name(tmp_path):
    (tmp_path / "a.py").write_text("import os\n\ndef f():\n    return spawned_answer(os)\n")
    assert undefined_names([tmp_path / "a.py"]) == [f"{tmp_path / 'a.py'}:4:12: undefined name 'spawned_answer'"]


def test_no_file_uses_an_undefined_name():
    files = sorted(p for folder in ("nanorllm", "launch", "tests") for p in (ROOT / folder).rglob("*.py"))
    assert undefined_names(files) == []
