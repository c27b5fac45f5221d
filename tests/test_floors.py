"""The floors below the trainer take small typed specs, never the whole TrainConfig: an untyped `cfg.field`
read in policy/, envs/, rewards/, rollout/, core/, datasets/ or algos/ would tie a lower floor to the config's field
names with no import to show it (the specs are read off the config in one place, nanorllm/config/specs.py; a reward
source reads its spec off its own flags' group, declared beside it in its module, rewards/sources.py)."""

import ast
from dataclasses import fields
from pathlib import Path

import nanorllm
from nanorllm.config import TrainConfig

PACKAGE = Path(nanorllm.__file__).resolve().parent
LOWER_FLOORS = ("policy", "envs", "rewards", "rollout", "core", "datasets", "algos")
FIELDS = {f.name for f in fields(TrainConfig)}
CONFIG_NAMES = ("cfg", "config", "train_cfg", "train_config")  # what a TrainConfig is called in this package


def config_reads(source: str, path: str = "<snippet>") -> list[str]:
    """`path:line name.field` for every TrainConfig field read off a name a config goes by (`cfg.lr`,
    `getattr(cfg, "lr")`), and every import of nanorllm.config."""
    out = []
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in CONFIG_NAMES \
                and node.attr in FIELDS:
            out.append(f"{path}:{node.lineno} {node.value.id}.{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and node.args[0].id in CONFIG_NAMES
              and isinstance(node.args[1], ast.Constant) and node.args[1].value in FIELDS):
            out.append(f"{path}:{node.lineno} {node.func.id}({node.args[0].id}, {node.args[1].value!r})")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nanorllm.config"):
            out.append(f"{path}:{node.lineno} from {node.module} import ...")
        elif isinstance(node, ast.Import) and any(a.name.startswith("nanorllm.config") for a in node.names):
            out.append(f"{path}:{node.lineno} import nanorllm.config")
    return out


def test_the_checker_sees_a_config_read_an_import_and_a_getattr():
    snippet = ("from nanorllm.config import TrainConfig\n"
               "def f(cfg, config):\n"
               "    return cfg.max_turns, getattr(config, 'lr', 0), config.vocab_size, cfg.lr\n")
    assert config_reads(snippet) == ["<snippet>:1 from nanorllm.config import ...", "<snippet>:3 cfg.max_turns",
                                     "<snippet>:3 getattr(config, 'lr')", "<snippet>:3 cfg.lr"]


def test_no_module_of_a_lower_floor_reads_a_train_config_field():
    paths = [p for floor in LOWER_FLOORS for p in sorted((PACKAGE / floor).rglob("*.py"))]
    assert len(paths) > 30  # it reads the real package
    reads = [r for p in paths for r in config_reads(p.read_text(), str(p.relative_to(PACKAGE)))]
    assert reads == []
