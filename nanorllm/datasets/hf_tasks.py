"""Task sets in the formats Hugging Face users already hold, read by the `datasets` library.

    data.parquet, data.csv, data.arrow, data.json (a JSON array)   one file
    dir/                                                          a `save_to_disk` folder, or a folder of
                                                                  .parquet / .jsonl / .json / .csv files
    hf:NAME[:config][@split]                                      a hub dataset (where a hub is reachable)

Rows become tasks {"task_id", "question", "answer", ...the row's other columns}: `--task-fields
question=problem,answer=solution,task_id=id` names the source's columns; a source without a task id
column gets `<source>-<row>` ids (stable: the row's position). The gold answer may be a plain value,
a GSM8K solution (`#### 42`) or a MATH one (its last `\\boxed{}`), see golds.py.

`datasets` (and pyarrow under it) is imported only here, and only when such a source is loaded: the
JSONL and arith: paths, and a machine without those packages, never touch it. Problems of a column
(missing, of the wrong type) name the source, the column and the columns that exist; problems of rows
are listed together, like the JSONL reader's per-line ones.
"""

import itertools
import os
import tempfile
from pathlib import Path

from nanorllm.datasets.golds import gold_answer, question_value, task_columns, task_row
from nanorllm.datasets.errors import TaskFileError

FILE_BUILDERS = {".parquet": "parquet", ".csv": "csv", ".arrow": "arrow", ".jsonl": "json", ".json": "json"}
HUB_PREFIX = "hf:"
_TEXT = ("string", "large_string")
_INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_NUMBERS = _INTS + ("float16", "float32", "float64")
_LISTS = ("List", "LargeList", "Sequence", "list")  # a column of chat messages (datasets' feature class names)


def _is_json_array(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head.startswith(b"[")


def split_spec(spec: str) -> tuple[str, str]:
    """(source, split) of `<source>[@split]`: the split follows the last `@`, and only when the whole spec is
    not itself a path that exists (a folder named `data@v2` is a folder). The one rule every reader here uses."""
    if spec.startswith(HUB_PREFIX) or not Path(spec).exists():
        source, at, split = spec.rpartition("@")
        if at and source:
            return source, split
    return spec, ""


def is_datasets_source(spec: str) -> bool:
    """A spec this module reads (the JSONL reader keeps .jsonl files and JSON-lines .json files)."""
    if spec.startswith(HUB_PREFIX):
        return True
    path = Path(spec)
    if path.is_dir() or Path(split_spec(spec)[0]).is_dir():  # dir, dir@split
        return True
    suffix = path.suffix.lower()
    if suffix == ".json":
        return path.is_file() and _is_json_array(path)
    return suffix in FILE_BUILDERS and suffix != ".jsonl"


def _import_datasets(spec: str):
    try:
        import datasets
    except ImportError as e:
        raise TaskFileError(spec, [f"{spec}: reading this source needs the 'datasets' package "
                                   f"(pip install datasets pyarrow): {e}"]) from None
    datasets.disable_progress_bars()
    return datasets


def _folder_files(spec: str, path: Path) -> tuple[str, list[str]]:
    by_kind: dict[str, list[str]] = {}
    for f in sorted(path.iterdir()):
        if f.is_file() and f.suffix.lower() in FILE_BUILDERS and f.suffix.lower() != ".arrow":
            by_kind.setdefault(FILE_BUILDERS[f.suffix.lower()], []).append(str(f))
    if len(by_kind) != 1:
        found = ", ".join(sorted(by_kind)) or "none"
        raise TaskFileError(spec, [f"{spec}: a folder of tasks must be a save_to_disk folder or hold files of one "
                                   f"kind (.parquet, .jsonl/.json or .csv); found kinds: {found}"])
    (kind, files), = by_kind.items()
    return kind, files


def _pick_split(spec: str, loaded, split: str | None):
    if not hasattr(loaded, "column_names") or isinstance(loaded.column_names, dict):  # a DatasetDict
        splits = list(loaded)
        name = split or ("train" if "train" in splits else splits[0] if len(splits) == 1 else None)
        if name not in splits:
            raise TaskFileError(spec, [f"{spec}: split {name!r} not found (splits: {', '.join(splits)}); "
                                       "name one as <source>@<split>"])
        return loaded[name]
    return loaded


def _parquet_rows(path: Path) -> int | None:
    try:
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows if path.suffix.lower() == ".parquet" else None
    except Exception:
        return None


def _open(spec: str, cache_dir: str, limit: int | None = None):
    """The `datasets.Dataset` a spec names (one split); with `limit`, parquet files are read only as far as the
    first `limit` rows (streamed: nothing is converted or cached), any other source in full."""
    datasets = _import_datasets(spec)
    source, split = split_spec(spec)
    if spec.startswith(HUB_PREFIX):
        name, _, config = source[len(HUB_PREFIX):].partition(":")
        if not name:
            raise TaskFileError(spec, [f"{spec}: expected hf:NAME[:config][@split]"])
        try:  # the user's own hub cache (HF_DATASETS_CACHE): a second run does not download it again
            loaded = datasets.load_dataset(name, config or None, split=split or None)
        except Exception as e:  # no network, no such dataset, no such config or split
            offline = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("HF_DATASETS_OFFLINE")
            why = "the Hugging Face hub is not reachable from this machine" + (" (HF_HUB_OFFLINE is set)" if offline
                                                                               else "") + ", or it has no such dataset"
            raise TaskFileError(spec, [f"{spec}: cannot load {name!r}: {why} ({type(e).__name__}: {e})"]) from None
        return _pick_split(spec, loaded, split or None)
    path = Path(source)
    if not path.exists():
        raise TaskFileError(spec, [f"{spec}: file not found"])
    try:
        if path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()):
            return _pick_split(spec, datasets.load_from_disk(str(path)), split or None)
        kind, files = _folder_files(spec, path) if path.is_dir() else (FILE_BUILDERS[path.suffix.lower()], [str(path)])
        if limit is not None and kind == "parquet":
            streamed = datasets.load_dataset(kind, data_files=files, split="train", streaming=True)
            return datasets.Dataset.from_list(list(itertools.islice(streamed, limit)), features=streamed.features)
        return datasets.load_dataset(kind, data_files=files, split="train", cache_dir=cache_dir)
    except TaskFileError:
        raise
    except Exception as e:  # a file the reader cannot parse (datasets also refuses a parquet file with no rows)
        if _parquet_rows(path) == 0:
            raise TaskFileError(spec, [f"{spec}: no tasks (the source has no rows)"]) from None
        raise TaskFileError(spec, [f"{spec}: cannot read it as {path.suffix or 'a dataset folder'} "
                                   f"({type(e).__name__}: {e})"]) from None


def _dtype(feature) -> str:
    return getattr(feature, "dtype", type(feature).__name__)


def _check_columns(spec: str, features: dict, col: dict[str, str], mapped: set[str], *, gold: bool = True,
                   chat: bool = False) -> list[str]:
    """One problem per column that is missing or of the wrong type, naming the columns that exist."""
    have = ", ".join(features) or "none"
    wanted = {"question": _TEXT + (_LISTS if chat else ()), "answer": _TEXT + _NUMBERS, "task_id": _TEXT + _INTS}
    problems = []
    for key, column in col.items():
        how = f" (--task-fields {key}={column})" if key in mapped else ""
        if column not in features:
            if (key == "task_id" or (key == "answer" and not gold)) and key not in mapped:
                continue  # ids are made from the row positions; a prompt-only set has no gold
            problems.append(f"{spec}: column {column!r}{how} not found (columns: {have})")
        elif _dtype(features[column]) not in wanted[key]:
            expected = {"question": "text" + (" or a list of chat messages" if chat else ""),
                        "answer": "text or numbers", "task_id": "text or integers"}[key]
            problems.append(f"{spec}: column {column!r}{how} holds {_dtype(features[column])}, expected {expected}"
                            f" (columns: {have})")
    return problems


def _source_name(spec: str) -> str:
    source = split_spec(spec)[0]
    if spec.startswith(HUB_PREFIX):
        return source[len(HUB_PREFIX):].split(":")[0].replace("/", "_")
    return Path(source).stem


def load_dataset_tasks(spec: str, *, limit: int | None = None, fields: dict[str, str] | None = None,
                       gold: bool = True, chat: bool = False) -> list[dict]:
    """The tasks of a `datasets` source, checked in full (TaskFileError lists every problem); `gold` and
    `chat` as tasks.load_tasks takes them."""
    fields = fields or {}
    with tempfile.TemporaryDirectory(prefix="nanorllm-datasets-") as cache_dir:  # no cache left behind
        ds = _open(spec, cache_dir, limit)
        col = task_columns(fields, ds.column_names)
        problems = _check_columns(spec, dict(ds.features), col, set(fields), gold=gold, chat=chat)
        if problems:
            raise TaskFileError(spec, problems)
        if limit is not None:
            ds = ds.select(range(min(limit, len(ds))))
        rows = ds.to_list()
    if not rows:
        raise TaskFileError(spec, [f"{spec}: no tasks (the source has no rows)"])
    has_ids = col["task_id"] in ds.column_names
    stem, tasks, seen = _source_name(spec), [], {}
    for i, row in enumerate(rows):
        found = []
        question, why = question_value(row[col["question"]], chat=chat)
        if why:
            found.append(f"column {col['question']!r} {why}")
        answer, why = gold_answer(row[col["answer"]]) if col["answer"] in row else (None, None)
        if why:
            found.append(f"column {col['answer']!r} {why}")
        task_id = str(row[col["task_id"]]).strip() if has_ids and row[col["task_id"]] is not None else None
        if not has_ids:
            task_id = f"{stem}-{i:05d}"
        elif not task_id:
            found.append(f"column {col['task_id']!r} is empty")
        elif task_id in seen:
            found.append(f"column {col['task_id']!r} duplicates row {seen[task_id]} ({task_id!r})")
        else:
            seen[task_id] = i
        if found:
            problems += [f"{spec}: row {i}: {p}" for p in found]
            continue
        tasks.append(task_row(row, task_id, question, answer))
    if problems:
        raise TaskFileError(spec, problems)
    return tasks
