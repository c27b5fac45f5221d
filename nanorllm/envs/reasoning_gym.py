"""reasoning-gym's procedural datasets as an env: `--env reasoning-gym:NAME` (the adapter of envs/registry.py).

One question per episode, the dataset item's own; the reward is the dataset's own `score_answer(answer, entry)`.
The answer is read from `<answer>...</answer>` tags (reasoning-gym's `extract_answer`, `answer_format=tags`, the
default: its answers are often lists, words or grids, which braces in a box would garble) or from the last
`\\boxed{}` (`answer_format=boxed`). A wrong answer with turns left gets a user turn asking for another try; the
episode's reward is its last answer's score (partial scores count), 1.0 ends it; its success (`success_rate`,
held-out success, pass@k) is that full score alone. As in the math env, one worked exchange comes before the
question (`--no-worked-example` drops it): the first item of the target's first dataset
drawn with seed 0 (in neither default set: `DEFAULT_SETS`), answered in the answer format, which is what teaches a small
model to write the tags or the box at all.

Tasks are specs `rg:NAME,size=N,seed=S[,key=value...]`: `size` items of dataset NAME drawn with `seed`, every other
key going to the dataset's config (typed: true/false, int, float, else text). Several datasets mix by weight,
`rg:NAME1=2+NAME2=1,size=N,seed=S`, each one's own keys written `NAME1.key=value` (reasoning-gym's composite
dataset). A row carries the item as JSON (`entry`) and where it came from (`rg_spec`, `rg_index`): a worker scores
on the item rebuilt from those, exactly as the dataset made it, so no JSON round trip can change what is scored.
"""

import difflib
import functools
import hashlib
import json
import math
from dataclasses import dataclass, fields

from nanorllm.agents.chat_agent import ChatAgent
from nanorllm.core.types import RolloutResult
from nanorllm.datasets.errors import TaskFileError
from nanorllm.datasets.golds import extract_boxed
from nanorllm.envs.base import EnvBundle
from nanorllm.envs.math_env import MathEnv
from nanorllm.utils.modules import EnvSpecError

PREFIX = "rg:"
FORMATS = ("tags", "boxed")
# (size, seed) of the default training and held-out sets. reasoning-gym draws item i of seed S with Random(S + i),
# so the sets drawn with seeds S and T share items unless their ranges [S, S + size) never meet: held-out seed 2
# was training items 1-200 of seed 1. The worked exchange is item 0 of seed 0, in neither.
DEFAULT_SETS = ((2000, 1), (200, 1_000_000))
BOXED_PROMPT = ("Given a problem, think step by step, then give only the final answer in \\boxed{}, "
                "written exactly in the format the question asks for.")
RETRY_FEEDBACK = {"tags": "Your answer is incorrect. Check your work and try again. "
                          "Put your final answer between <answer> and </answer> tags.",
                  "boxed": "Your answer is incorrect. Check your work and try again. Put your final answer in \\boxed{}."}
NO_ANSWER_FEEDBACK = {"tags": "I could not find a final answer. Solve it again and put your final answer "
                              "between <answer> and </answer> tags.",
                      "boxed": "I could not find a final answer. Solve it again and put your final answer in \\boxed{}."}


def dataset_names() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(set(DATASETS) - {"composite"})


def _config_class(name: str, where: str, error=EnvSpecError):
    """The config dataclass of dataset `name`; an unknown name is refused with the closest known ones."""
    from reasoning_gym.factory import DATASETS

    if name == "composite":  # registered by reasoning-gym, but built from the other datasets: a mix is written here
        raise error(f"{where}: write a mix of datasets as NAME1=WEIGHT+NAME2=WEIGHT, not 'composite'")
    if name not in DATASETS:
        close = difflib.get_close_matches(name, dataset_names(), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(dataset_names())}"
        raise error(f"{where}: unknown reasoning-gym dataset {name!r} ({hint})")
    return DATASETS[name][1]


def _value(text: str):
    """A config value typed from its text: true/false, an int, a finite float, else the text itself."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            value = kind(text)
        except ValueError:
            continue
        if math.isfinite(value):
            return value
    return text


def _weighted_names(text: str, where: str, error) -> list[tuple[str, float]]:
    """[(name, weight)] of `NAME` or `NAME1=2+NAME2=1`."""
    out = []
    for part in text.split("+"):
        name, sep, weight = part.strip().partition("=")
        try:
            w = float(weight) if sep else 1.0
        except ValueError:
            w = -1.0
        if not name or not (w > 0 and math.isfinite(w)):
            raise error(f"{where}: expected NAME or NAME1=WEIGHT+NAME2=WEIGHT with positive weights, got {part!r}")
        _config_class(name, where, error)
        out.append((name, w))
    if len({n for n, _ in out}) != len(out):
        raise error(f"{where}: a dataset is named twice in {text!r}")
    return out


@dataclass(frozen=True)
class RgSpec:
    datasets: tuple[tuple[str, float, tuple], ...]  # (name, weight, sorted (key, value) config pairs)
    size: int
    seed: int

    @property
    def composite(self) -> bool:
        return len(self.datasets) > 1


def _task_error(spec: str):
    return lambda message: TaskFileError(spec, [message])


def parse_rg_spec(spec: str) -> RgSpec:
    """`rg:NAME[=W][+NAME2=W2...],size=N,seed=S[,key=value | NAME.key=value ...]`, each config key checked
    against its dataset's config fields (TaskFileError naming the key and the valid ones)."""
    error = _task_error(spec)
    if not spec.startswith(PREFIX):
        raise error(f"{spec}: expected rg:NAME,size=N,seed=S[,key=value...]")
    head, *pairs = spec[len(PREFIX):].split(",")
    names = _weighted_names(head, spec, error)
    params: dict[str, int] = {}
    config: dict[str, dict] = {n: {} for n, _ in names}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or not key:
            raise error(f"{spec}: {pair!r} is not key=value")
        if key in ("size", "seed"):
            try:
                params[key] = int(text)
            except ValueError:
                raise error(f"{spec}: {key}={text}: expected an int") from None
            continue
        owner, dot, field = key.rpartition(".")
        if not dot:
            if len(names) > 1:
                raise error(f"{spec}: {key}: with several datasets write NAME.{key}=value")
            owner, field = names[0][0], key
        if owner not in config:
            raise error(f"{spec}: {key}: {owner!r} is not one of the datasets named ({', '.join(config)})")
        valid = [f.name for f in fields(_config_class(owner, spec, error)) if f.name not in ("size", "seed")]
        if field not in valid:
            raise error(f"{spec}: {key}: {owner} has no config key {field!r} (valid: {', '.join(valid)})")
        if field in config[owner]:
            raise error(f"{spec}: {key} is given twice")
        config[owner][field] = _value(text)
    for key in ("size", "seed"):
        if key not in params:
            raise error(f"{spec}: {key}=N is missing")
    if params["size"] < 1:
        raise error(f"{spec}: size={params['size']}: expected at least 1")
    return RgSpec(tuple((n, w, tuple(sorted(config[n].items()))) for n, w in names), params["size"], params["seed"])


@functools.lru_cache(maxsize=16)
def build_dataset(spec: str):
    """The dataset a task spec names (one per spec and process: workers rebuild items from it)."""
    parsed = parse_rg_spec(spec)
    try:
        if not parsed.composite:
            import reasoning_gym

            (name, _, config), = parsed.datasets
            return reasoning_gym.create_dataset(name, size=parsed.size, seed=parsed.seed, **dict(config))
        from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

        specs = [DatasetSpec(name=n, weight=w, config=dict(c)) for n, w, c in parsed.datasets]
        return CompositeDataset(CompositeConfig(size=parsed.size, seed=parsed.seed, datasets=specs))
    except (AssertionError, TypeError, ValueError) as e:  # the dataset's config refused a value
        raise TaskFileError(spec, [f"{spec}: the dataset refused its config: {type(e).__name__}: {e}"]) from e


def _jsonable(value):
    return json.loads(json.dumps(value, default=lambda v: sorted(v, key=str) if isinstance(v, (set, frozenset))
                                 else str(v)))


def load_rg_tasks(spec: str, *, limit: int | None = None) -> list[dict]:
    """The rows of an rg: spec: task_id (the datasets' names, a digest of the spec less its size, the index: the
    same item has the same id in a larger draw), question, answer, entry (the item as JSON), rg_spec, rg_index."""
    parsed = parse_rg_spec(spec)
    dataset = build_dataset(spec)
    names = "+".join(n for n, _, _ in parsed.datasets)
    digest = hashlib.sha1(repr((parsed.datasets, parsed.seed)).encode()).hexdigest()[:8]
    rows = []
    for i in range(parsed.size if limit is None else min(parsed.size, limit)):
        entry = dataset[i]
        rows.append({"task_id": f"rg-{names}-{digest}-{i}", "question": entry["question"],
                     "answer": str(entry["answer"]), "entry": _jsonable(entry), "rg_spec": spec, "rg_index": i})
    return rows


def extract(response: str, answer_format: str) -> str | None:
    from reasoning_gym.utils import extract_answer

    return extract_answer(response) if answer_format == "tags" else extract_boxed(response)


def score(task: dict, answer: str | None) -> float:
    """The dataset's own score of `answer` on the task's item, rebuilt from its spec and index."""
    dataset = build_dataset(task["rg_spec"])
    value = float(dataset.score_answer(answer, dataset[task["rg_index"]]))
    if not math.isfinite(value):
        raise ValueError(f"score_answer gave {value} for task {task['task_id']}")
    return value


class ReasoningGymEnv(MathEnv):
    """MathEnv's turns (its reset, its turn count) with the dataset's own extraction and score."""

    def __init__(self, *, max_turns: int = 1, answer_format: str = "tags"):
        super().__init__(max_turns=max_turns)
        self.answer_format = answer_format

    def step(self, response: str) -> tuple[str | None, float, bool, dict]:
        assert self.task is not None, "call reset(task) first"
        self.turn += 1
        answer = extract(response, self.answer_format)
        value = score(self.task, answer)
        # success is the full score: a partial one (a close answer) rewards, it does not solve
        info = {"action": answer, "score": value, "correct": value >= 1.0, "success": value >= 1.0, "turn": self.turn}
        if value >= 1.0:
            return None, value, True, {**info, "reason": "correct"}
        if self.turn >= self.max_turns:
            return None, value, True, {**info, "reason": "wrong"}
        feedback = (RETRY_FEEDBACK if answer is not None else NO_ANSWER_FEEDBACK)[self.answer_format]
        return feedback, 0.0, False, info


class ReasoningGym(EnvBundle):
    """A reasoning-gym dataset (subclassed per dataset by `bundle_class`)."""

    name = "reasoning-gym"
    env_class = ReasoningGymEnv
    args = {"answer_format": "tags"}  # tags: <answer>...</answer>, reasoning-gym's own; boxed: \boxed{}
    target = ""

    def __init__(self, settings=None, **options):
        super().__init__(settings, **options)
        if self.options["answer_format"] not in FORMATS:
            raise ValueError(f"answer_format={self.options['answer_format']!r}: expected one of {', '.join(FORMATS)}")

    def make_env(self) -> ReasoningGymEnv:
        return ReasoningGymEnv(max_turns=self.settings.max_turns, **self.options)

    def make_agent(self) -> ChatAgent:
        from reasoning_gym.utils import SYSTEM_PROMPTS

        own = SYSTEM_PROMPTS["default"] if self.options["answer_format"] == "tags" else BOXED_PROMPT
        s = self.settings
        return ChatAgent(system_prompt=own if s.system_prompt is None else s.system_prompt,
                         example=worked_example(self.target, self.options["answer_format"]) if s.worked_example else None)

    def load_tasks(self, spec: str, *, limit: int | None = None) -> list[dict]:
        return load_rg_tasks(spec, limit=limit)

    def demonstrations(self, task: dict) -> list[dict]:
        """The dataset's stored answer, in the tags or box the env extracts."""
        return [{"role": "assistant", "content": gold_reply(task["answer"], self.options["answer_format"])}]

    def metrics(self, results: list[RolloutResult]) -> dict:
        """Episodes whose last answer got the dataset's full score (1.0): the episodes' success, kept under its own
        name for the curves logged when success counted partial scores."""
        solved = sum(bool(r.trajectory.steps) and bool(r.trajectory.steps[-1].info.get("correct")) for r in results)
        return {"reasoning_gym/solved": solved / max(len(results), 1)}


@functools.lru_cache(maxsize=16)
def worked_example(target: str, answer_format: str) -> tuple[str, str]:
    """(question, answer) of the worked exchange: item 0 of `target`'s first dataset with seed 0 and its default
    config, its gold answer written the way the env reads answers."""
    name = _weighted_names(target, f"reasoning-gym:{target}", EnvSpecError)[0][0]
    entry = build_dataset(f"{PREFIX}{name},size=1,seed=0")[0]
    return entry["question"], gold_reply(str(entry["answer"]), answer_format)


def gold_reply(answer: str, answer_format: str) -> str:
    """An answer written the way the env reads answers: <answer>...</answer> (tags) or \\boxed{...}."""
    return f"<answer>{answer}</answer>" if answer_format == "tags" else f"\\boxed{{{answer}}}"


def bundle_class(target: str) -> type[ReasoningGym]:
    """The bundle of `--env reasoning-gym:NAME` (or `NAME1=W1+NAME2=W2`): the default training and held-out sets
    (`DEFAULT_SETS`)."""
    _weighted_names(target, f"reasoning-gym:{target}", EnvSpecError)
    (train_size, train_seed), (eval_size, eval_seed) = DEFAULT_SETS
    return type(f"ReasoningGym[{target}]", (ReasoningGym,), {
        "name": f"reasoning-gym:{target}", "target": target,
        "default_tasks": f"{PREFIX}{target},size={train_size},seed={train_seed}",
        "default_eval_tasks": f"{PREFIX}{target},size={eval_size},seed={eval_seed}"})
