"""The --config file: a JSON or YAML mapping of TrainConfig fields, each value typed as its flag's text would be,
every wrong key or value a problem naming the field, the file and the line."""

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Literal, Union, get_args, get_origin, get_type_hints

from nanorllm.config.errors import ConfigError
from nanorllm.config.fields import TrainConfig


@dataclass
class ConfigFile:
    """A --config file read field by field: typed values, what is wrong with it, and each key's line."""

    path: str
    values: dict
    problems: list[str]
    lines: dict[str, int]

    def where(self, name: str) -> str:
        return f"{self.path}:{self.lines[name]}" if name in self.lines else self.path


def load_config_file(path: str) -> ConfigFile:
    """Read a JSON or YAML mapping of TrainConfig fields, each value converted by its field's type as a flag's
    would be (`lr: 1e-5`, which YAML reads as text, is the float 1e-5). Every wrong type, unknown key and
    repeated key is a problem naming the field, the file and the line; the good values are kept, so the
    caller can report them beside the other problems. A file that cannot be read or parsed raises
    ConfigError at once."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([f"--config {path}: cannot read it ({type(e).__name__}: {e})"], path) from None
    import yaml

    try:
        data = yaml.safe_load(text) if path.endswith((".yaml", ".yml")) else json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError([f"{path}:{e.lineno}: invalid JSON: {e.msg}"], path) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{path}:{mark.line + 1}" if mark is not None else path
        raise ConfigError([f"{at}: invalid YAML: {getattr(e, 'problem', None) or e}"], path) from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: expected a mapping of fields, got {type(data).__name__}"], path)
    out = ConfigFile(path, {}, [], {})
    repeated = []
    try:  # YAML is a superset of JSON: its nodes carry each key's line for either format
        for key, _ in yaml.compose(text).value:
            if key.value in out.lines:
                repeated.append(f"{key.value}: given twice (lines {out.lines[key.value]} and "
                                f"{key.start_mark.line + 1})")
            out.lines.setdefault(str(key.value), key.start_mark.line + 1)
    except (yaml.YAMLError, AttributeError):  # JSON that PyYAML's YAML 1.1 reads differently: no line numbers
        pass
    hints = get_type_hints(TrainConfig)
    for key, value in data.items():
        name = str(key)
        if name not in hints:
            close = difflib.get_close_matches(name, list(hints), n=1, cutoff=0.8)
            out.problems.append(f"{name}: unknown field{f' (did you mean {close[0]}?)' if close else ''} "
                                f"({out.where(name)})")
            continue
        try:
            out.values[name] = convert_field(value, hints[name])
        except ValueError as e:
            out.problems.append(f"{name}: {e} ({out.where(name)})")
    out.problems += [f"{r} in {path}" for r in repeated]
    return out




def read_config_file(path: str) -> dict:
    """A JSON or YAML mapping of TrainConfig fields, typed; any problem raises ConfigError listing them all."""
    f = load_config_file(path)
    if f.problems:
        raise ConfigError(f.problems, path)
    return f.values


def _got(value: object) -> str:
    return f"got {value!r} ({'null' if value is None else type(value).__name__})"


def convert_field(value: object, hint: object) -> object:
    """A config file's value as the field typed `hint` holds it, converted the way its flag's text would be
    (numbers may be written as text: "1e-5"); ValueError says what was expected and what came."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, UnionType):
        if type(None) in args and (value is None or value in ("None", "null")):
            return None
        (inner,) = [a for a in args if a is not type(None)]
        try:
            return convert_field(value, inner)
        except ValueError as e:
            raise ValueError(f"{e}; or null to leave it unset") from None
    if origin is Literal:
        if isinstance(value, str):
            return value  # off the choices: validate() names it beside the other problems
        raise ValueError(f"expected one of {', '.join(args)}, {_got(value)}")
    if origin is tuple:
        if args[-1] is Ellipsis and isinstance(value, dict):  # env_arg as a mapping of the env's options
            return tuple(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in value.items())
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"expected a list, {_got(value)}")
        types = [args[0]] * len(value) if args[-1] is Ellipsis else list(args)
        if len(types) != len(value):
            raise ValueError(f"expected a list of {len(types)}, {_got(value)}")
        return tuple(convert_field(v, t) for v, t in zip(value, types))
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError(f"expected true or false, {_got(value)}")
    if hint in (int, float):
        if isinstance(value, str):
            try:
                return hint(value.strip())
            except ValueError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            return hint(value)
        elif isinstance(value, float) and hint is float:
            return value
        raise ValueError(f"expected {'an integer' if hint is int else 'a number'}, {_got(value)}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ValueError(f"expected text, {_got(value)} (quote it to mean the text)")
    raise ValueError(f"cannot be set from a file ({hint})")

