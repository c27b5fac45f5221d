"""docs/metrics.md lists every scalar the trainer writes, and nothing it no longer writes.

Two sources of names: the scalars the shared tiny runs write (tests/runs.py: serial, serial LoRA with a KL
term and a correction, and the pipeline), and every metric-shaped string in the package's code (conditional scalars a short run never
reaches: FSDP's gather time, the decoupled correction's masks). f-strings count as patterns.
"""

import ast
import re
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import nanorllm

PACKAGE = Path(nanorllm.__file__).resolve().parent
DOC = PACKAGE.parent / "docs" / "metrics.md"
NAMESPACES = ("reward", "success_rate", "episode", "groups", "completions", "rollout", "eval", "loss", "clip_ratio",
              "advantage", "train", "mismatch", "is_weight", "perf", "pipeline", "tool", "sft", "fit", "sampler",
              "selfplay")
METRIC = re.compile(rf"^({'|'.join(NAMESPACES)})(/[a-z0-9_]+)+$")
PLACEHOLDERS = {"<i>": r"\d+", "<reason>": r"[a-z_]+"}


def documented() -> tuple[set[str], list[re.Pattern]]:
    """(plain names, placeholder patterns) from the doc's table: the first column's names, and the names
    with a slash that a row's description lists (the env's own)."""
    names = set()
    for line in DOC.read_text().splitlines():
        cells = line.split("|")
        if not line.startswith("| `") or len(cells) < 4:
            continue
        names |= set(re.findall(r"`([^`]+)`", cells[1]))
        names |= {n for n in re.findall(r"`([^`]+)`", cells[2]) if "/" in n and not n.startswith("-")}
    patterns = []
    for n in [n for n in names if "<" in n]:
        names.discard(n)
        regex = re.escape(n)
        for ph, sub in PLACEHOLDERS.items():
            regex = regex.replace(re.escape(ph), sub)
        if "<" not in regex:  # <env> is no name of its own
            patterns.append(re.compile(f"^{regex}$"))
    return names, patterns


def in_doc(name: str, names: set[str], patterns: list[re.Pattern]) -> bool:
    return name in names or any(p.match(name) for p in patterns) or (
        name.startswith("eval/") and name[5:] in names)  # eval/<env>


def code_strings() -> tuple[set[str], list[re.Pattern]]:
    """Every string constant in the package (but the benchmarks and the fault suite), and every f-string as
    a pattern (its formatted parts match anything)."""
    plain, patterns = set(), []
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name in ("bench", "faultsuite"):
            continue
        tree = ast.parse(path.read_text())
        parts = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                pieces = [re.escape(v.value) if isinstance(v, ast.Constant) else ".+" for v in node.values]
                patterns.append(re.compile("^" + "".join(pieces) + "$"))
                parts |= {id(v) for v in node.values}
        plain |= {n.value for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in parts}
    return plain, patterns


def written_by_runs(*runs: Path) -> set[str]:
    tags = set()
    for run in runs:
        events = EventAccumulator(str(run), size_guidance={"scalars": 0})
        events.Reload()
        tags |= set(events.Tags()["scalars"])
    return tags


def test_the_doc_parser_reads_names_placeholders_and_the_envs_own():
    names, patterns = documented()
    assert {"reward/mean", "perf/step_s", "pipeline/policy_lag_max", "tool/calls_per_episode"} <= names
    assert in_doc("pipeline/worker3/gen_tokens_per_s", names, patterns)
    assert in_doc("episode/termination/max_turns", names, patterns)
    assert in_doc("eval/tool/calls_per_episode", names, patterns)
    assert not in_doc("pipeline/worker_x/gen_tokens_per_s", names, patterns)
    assert not in_doc("perf/nonexistent", names, patterns)


def test_every_metric_string_in_the_code_is_documented():
    names, patterns = documented()
    plain, _ = code_strings()
    missing = sorted(s for s in plain if METRIC.match(s) and not in_doc(s, names, patterns))
    assert not missing, f"scalars the code writes but docs/metrics.md does not list: {missing}"


@pytest.mark.slow
def test_every_scalar_a_run_writes_is_documented_and_every_documented_one_exists(serial_runs, lora_runs,
                                                                                   pipeline_run):
    """The shared runs: serial (full fine-tuning, with every periodic output), serial LoRA with a KL term
    and the TIS correction, and the 2-worker pipeline."""
    names, patterns = documented()
    written = written_by_runs(Path(serial_runs["full"]), Path(lora_runs["part"]), Path(pipeline_run["run"]))
    assert {"train/samples", "train/tokens", "train/padded_tokens", "train/episodes", "loss/kl"} <= written
    missing = sorted(t for t in written if not in_doc(t, names, patterns))
    assert not missing, f"scalars a run wrote that docs/metrics.md does not list: {missing}"
    plain, fstrings = code_strings()
    stale = sorted(n for n in names if n not in written and n not in plain and not any(p.match(n) for p in fstrings))
    assert not stale, f"docs/metrics.md lists scalars nothing writes: {stale}"
