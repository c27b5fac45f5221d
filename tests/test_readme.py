"""The README's data-flow block runs as printed, from the names the package root exports (lazily); its folder table
is the tree's: every folder once, every module named in its folder's row, no module named that is not there."""

import re
import subprocess
import sys
from pathlib import Path

import torch

import nanorllm

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def test_the_readme_data_flow_runs_as_printed():
    block = next(b for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.S) if "from nanorllm import" in b)
    scope: dict = {}
    torch.manual_seed(0)
    exec(compile(block, "README.md", "exec"), scope)
    results, samples, loss = scope["results"], scope["samples"], scope["loss"]
    assert len(results) == 4 and {r.task_id for r in results} == {"t1"}
    assert len(samples) == sum(len(r.step_samples) for r in results) and torch.isfinite(loss)
    assert scope["batch"]["loss_mask"].sum() == sum(len(s.response_ids) for s in samples)


def test_the_package_root_exports_the_design_names_lazily():
    names = {"Step", "Trajectory", "StepSample", "RolloutResult", "MathEnv", "MathAgent", "HFCausalPolicy",
             "RolloutEngine", "collect_rollouts", "group_by_task_id", "compute_advantage", "flatten_step_samples",
             "collate_train_batch", "compute_policy_loss", "TrainConfig", "run_training", "EnvBundle"}
    assert names <= set(nanorllm.__all__)
    from nanorllm.run.lifecycle import run_training
    from nanorllm.trainer.step import collect_rollouts

    assert nanorllm.run_training is run_training and nanorllm.collect_rollouts is collect_rollouts
    try:
        nanorllm.no_such_name
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("an unknown name must raise AttributeError")
    probe = "import sys, nanorllm; print('torch' in sys.modules, nanorllm.TrainConfig().max_steps)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "24"]  # importing the package loads no torch; a config needs none either


def folder_rows(text: str) -> list[tuple[str, str]]:
    """(folder, what) of each row of the README's folder table."""
    table = text[text.index("| folder | what |"):].split("\n\n")[0]
    return re.findall(r"^\| `([^`]+/)` \| (.*) \|$", table, re.M)


def unnamed_modules(folder: str, what: str) -> list[str]:
    return sorted(p.name for p in (ROOT / folder).iterdir()
                  if p.suffix in (".py", ".sh") and p.name != "__init__.py" and f"`{p.name}`" not in what)


def absent_modules(folder: str, what: str) -> list[str]:
    """Modules a row names by their bare file name (`x.py`) that its folder does not hold."""
    return [name for name in re.findall(r"`(\w+\.(?:py|sh))`", what) if not (ROOT / folder / name).exists()]


def test_the_readme_folder_table_lists_every_folder_once_and_names_every_module_in_its_row():
    rows = folder_rows(README.read_text())
    folders = [folder for folder, _ in rows]
    assert sorted(f for f in set(folders) if folders.count(f) > 1) == [], "a folder listed twice"
    package = Path(nanorllm.__file__).resolve().parent
    assert sorted(folders) == sorted([f"nanorllm/{p.name}/" for p in package.iterdir() if p.is_dir() and
                                      any(p.glob("*.py"))] + ["launch/"])
    assert {folder: unnamed_modules(folder, what) for folder, what in rows if unnamed_modules(folder, what)} == {}
    assert {folder: absent_modules(folder, what) for folder, what in rows if absent_modules(folder, what)} == {}
    assert unnamed_modules("nanorllm/trainer/", "`loop.py`, `update.py`")[:2] == ["checkpoint.py", "collapse.py"]
    assert absent_modules("nanorllm/trainer/", "`loop.py` (and `launch/eval.py`), `gone.py`") == ["gone.py"]
