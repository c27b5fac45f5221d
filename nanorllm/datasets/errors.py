"""TaskFileError: a task source that cannot be used, with every problem found in it.

Its own module so that every reader (tasks.py's JSONL reader, hf_tasks.py's `datasets` one) raises the
same error without importing each other; `nanorllm.datasets.tasks` re-exports it.
"""

import os


class TaskFileError(Exception):
    """A tasks file that cannot be used; `problems` lists every defect found in it."""

    def __init__(self, path: str | os.PathLike, problems: list[str]):
        super().__init__(path, problems)
        self.path = str(path)
        self.problems = list(problems)

    def __str__(self) -> str:
        n = len(self.problems)
        summary = f"{n} problem{'' if n == 1 else 's'} in tasks file {self.path}:"
        return "\n".join([summary, *self.problems])
