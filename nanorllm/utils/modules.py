"""Importing what a spec string names: a module path or a file path, once per process.

Shared by the env registry and the reward functions (both take `module.path:Name` or `path/to/file.py:Name`),
so that a worker that imports a user's file for one of them reuses it for the other.
"""

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path


class EnvSpecError(ValueError):
    pass


def _import_module(where: str, spec: str):
    """The module `where` names (a file path or a module path); EnvSpecError naming the file when importing it
    calls sys.exit (a script's argument parsing, say) or raises KeyboardInterrupt (a script waiting on input): either
    would end the run with the file's code, or a traceback, instead of a refusal naming the file."""
    try:
        return _load(where, spec)
    except (SystemExit, KeyboardInterrupt) as e:
        how = f"called sys.exit({e.code!r})" if isinstance(e, SystemExit) else "raised KeyboardInterrupt"
        raise EnvSpecError(f"{spec!r}: importing {where} {how}; a file the run imports must define its functions "
                           "without running a program (guard it with if __name__ == '__main__':)") from None


def _load(where: str, spec: str):
    if where.endswith(".py"):
        path = Path(where).resolve()
        if not path.is_file():
            raise EnvSpecError(f"{spec!r}: file {path} not found")
        # One module name per file, so a second load (another engine, a worker) reuses it.
        name = f"nanorllm_user_env_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        if name in sys.modules:
            return sys.modules[name]
        mod_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        try:
            mod_spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module
    return importlib.import_module(where)


def import_spec(spec: str, expected: str, *, target: str | None = None):
    """(module, where, name) of a `where:name` spec (or of its `target`, the part after an ecosystem's prefix), its
    module imported; `expected` says the form in the error, which names the whole spec."""
    where, sep, name = (spec if target is None else target).rpartition(":")
    if not sep or not where or not name:
        raise EnvSpecError(f"{spec!r}: expected {expected}")
    try:
        return _import_module(where, spec), where, name
    except EnvSpecError:
        raise
    except Exception as e:
        raise EnvSpecError(f"{spec!r}: cannot import {where!r}: {type(e).__name__}: {e}") from e
