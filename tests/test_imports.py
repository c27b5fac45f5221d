"""The package's modules import each other without a cycle, counting imports inside functions: a lazy
import only hides a cycle from the interpreter, not from a reader who has to hold both files at once.
Its folders do too: each subpackage (and each top-level module) is one node, so a folder can be read
and changed knowing only the folders below it; the wiring that uses them all sits on top, in run/."""

import ast
import functools
from pathlib import Path

import nanorllm

PACKAGE = Path(nanorllm.__file__).resolve().parent


@functools.cache  # each file parsed once a process, for every check here
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, modules: set[str]) -> set[str]:
    """nanorllm modules that `path` imports anywhere in it (`from a import b` counts a.b when it is a module)."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:  # `import nanorllm.a.b.c` of a name inside a module
                name = name.rpartition(".")[0]
            if name and name != here and name != "nanorllm":
                out.add(name)
    return out


@functools.cache  # parsing every module is the test's cost: once a process (callers only read it)
def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imported(p, modules) for p in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search, three colours)."""
    state, stack = {}, []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_checker_sees_a_cycle_through_a_lazy_import():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    graph = import_graph()
    assert "nanorllm.trainer.step" in graph["nanorllm.trainer.loop"]  # it reads the real package


def test_no_import_cycle_in_the_package():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def folder_of(module: str) -> str:
    """`nanorllm.trainer.loop` -> `trainer`; a top-level module (`nanorllm.config`) is its own node."""
    return module.split(".")[1] if module.count(".") else module


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, imports in graph.items():
        here = folder_of(module)
        out.setdefault(here, set()).update(folder_of(m) for m in imports if folder_of(m) != here)
    return out


def test_the_folder_graph_joins_modules_by_folder():
    graph = {"nanorllm.a.x": {"nanorllm.b.y"}, "nanorllm.b.y": {"nanorllm.top"}, "nanorllm.top": {"nanorllm.a.z"},
             "nanorllm.a.z": set()}
    assert folder_graph(graph) == {"a": {"b"}, "b": {"top"}, "top": {"a"}}
    assert find_cycle(folder_graph(graph)) == ["a", "b", "top", "a"]  # no module cycle, but a folder one


def test_no_import_cycle_between_the_package_folders():
    folders = folder_graph(import_graph())
    cycle = find_cycle(folders)
    assert cycle is None, "folder import cycle: " + " -> ".join(cycle)
    # the wiring is on top: only the benchmarks, which drive whole runs, use it
    assert {folder for folder, imports in folders.items() if "run" in imports} == {"bench"}
    # the supervised programs sit on top too, imported only by the wiring that runs them (run/sft_program.py) and the
    # benchmarks that time them; the reward sources sit below the envs
    assert {folder for folder, imports in folders.items() if "supervised" in imports} == {"bench", "run"}
    assert "envs" not in folders["rewards"] and "rewards" in folders["envs"]
    # the fault suite is a tool on top that launch/chaos.py runs: nothing in the package imports it (production
    # code reaches fault injection through utils/faults.py)
    assert {folder for folder, imports in folders.items() if "faultsuite" in imports} == set()


def imports_launch(path: Path) -> bool:
    """Whether `path` imports a launch/ script (`import launch.eval`, `from launch import eval`, ...), or puts
    launch/ on the import path to import one by its bare name (`monkeypatch.syspath_prepend(ROOT / "launch")`)."""
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("syspath_prepend", "insert", "append") \
                and "path" in ast.unparse(node.func) and any("launch" in ast.unparse(a) for a in node.args):
            return True
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        if any(name == "launch" or name.startswith("launch.") for name in names):
            return True
    return False


def test_the_launch_scripts_are_imported_by_nothing_so_they_stay_thin(tmp_path):
    (tmp_path / "a.py").write_text("def f():\n    import launch.eval as e\n")
    (tmp_path / "b.py").write_text("from launcher import x\nimport nanorllm.run\n")
    (tmp_path / "c.py").write_text("def t(monkeypatch):\n    monkeypatch.syspath_prepend(str(ROOT / 'launch'))\n")
    (tmp_path / "d.py").write_text("import sys\nsys.path.insert(0, 'launch')\nrows.append('launch')\n")
    assert imports_launch(tmp_path / "a.py") and not imports_launch(tmp_path / "b.py")
    assert imports_launch(tmp_path / "c.py") and imports_launch(tmp_path / "d.py")
    tests = Path(__file__).resolve().parent
    offenders = [str(p) for p in [*PACKAGE.rglob("*.py"), *tests.rglob("*.py")] if imports_launch(p)]
    assert offenders == [], "a launch/ script imported (call the package function it calls): " + ", ".join(offenders)
