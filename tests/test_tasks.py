"""Tests for task loading and the synthetic arithmetic generator."""

import ast
import json
import operator
import re
from pathlib import Path

import pytest

from nanorllm.datasets.arithmetic import (
    arithmetic_space_size,
    make_arithmetic_tasks,
    parse_arith_spec,
)
from nanorllm.datasets.tasks import TaskFileError, load_tasks, remove_overlap

GSM8K_TRAIN = Path("/work/shared/data/gsm8k/train.jsonl")
QUESTION = re.compile(r"What is (.+)\?")
BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def reference_value(question: str) -> int:
    """Value of a generated question, computed through Python's own parser (not the generator)."""

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp):
            return BINOPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        raise AssertionError(f"unexpected node {ast.dump(node)}")

    expr = QUESTION.fullmatch(question).group(1)
    return walk(ast.parse(expr, mode="eval").body)


def operands_of(question: str) -> list[str]:
    return re.findall(r"\d+", QUESTION.fullmatch(question).group(1))


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# ---------------------------------------------------------------- arithmetic


def test_hand_checked_answers_follow_precedence():
    tasks = make_arithmetic_tasks(digits=1, terms=3, ops="+-*", count=9000, seed=5)
    by_question = {t["question"]: t["answer"] for t in tasks}
    assert len(by_question) == 9000
    assert by_question["What is 7 + 3 - 5?"] == "5"
    assert by_question["What is 2 + 3 * 4?"] == "14"
    assert by_question["What is 2 * 3 + 4?"] == "10"
    assert by_question["What is 1 - 9 * 9?"] == "-80"
    assert by_question["What is 0 - 9 - 9?"] == "-18"
    assert by_question["What is 9 * 9 * 9?"] == "729"
    assert by_question["What is 8 - 2 * 3?"] == "2"


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(digits=1, terms=3, ops="+-*", count=300, seed=0),
        dict(digits=2, terms=4, ops="+-*", count=300, seed=11),
        dict(digits=2, terms=2, ops="-*", count=300, seed=2),
        dict(digits=1, terms=4, ops="*-", count=300, seed=7),
        dict(digits=3, terms=1, ops="+", count=50, seed=8),
    ],
)
def test_answers_match_independent_evaluation(kwargs):
    tasks = make_arithmetic_tasks(**kwargs)
    assert len(tasks) == kwargs["count"]
    for task in tasks:
        assert task["answer"] == str(reference_value(task["question"])), task
        assert len(operands_of(task["question"])) == kwargs["terms"]


def test_same_seed_same_tasks_different_seed_different_order():
    a = make_arithmetic_tasks(digits=1, terms=2, ops="+-", count=200, seed=1)
    b = make_arithmetic_tasks(digits=1, terms=2, ops="+-", count=200, seed=1)
    c = make_arithmetic_tasks(digits=1, terms=2, ops="+-", count=200, seed=2)
    assert a == b
    assert [t["question"] for t in a] != [t["question"] for t in c]
    assert {t["question"] for t in a} == {t["question"] for t in c}


def test_large_space_is_sampled_deterministically():
    kwargs = dict(digits=3, terms=4, ops="+-*", count=100)
    assert arithmetic_space_size(3, 4, "+-*") > 2_000_000
    a = make_arithmetic_tasks(**kwargs, seed=4)
    assert a == make_arithmetic_tasks(**kwargs, seed=4)
    b = make_arithmetic_tasks(**kwargs, seed=5)
    assert [t["question"] for t in a] != [t["question"] for t in b]
    assert len({t["question"] for t in a}) > 95


def test_no_repeats_until_space_is_used_up():
    size = arithmetic_space_size(1, 2, "+-")
    assert size == 200
    tasks = make_arithmetic_tasks(digits=1, terms=2, ops="+-", count=2 * size + 10, seed=3)
    questions = [t["question"] for t in tasks]
    assert len(set(questions[:size])) == size
    assert len(set(questions[size : 2 * size])) == size
    assert set(questions[size : 2 * size]) == set(questions[:size])
    assert questions[size : 2 * size] != questions[:size]


def test_space_size():
    assert arithmetic_space_size(1, 2, "+") == 100
    assert arithmetic_space_size(2, 2, "+-") == 90 * 90 * 2
    assert arithmetic_space_size(1, 3, "+-*") == 1000 * 9
    assert arithmetic_space_size(3, 1, "*") == 900
    assert arithmetic_space_size(1, 2, "++-") == arithmetic_space_size(1, 2, "+-")


@pytest.mark.parametrize(
    "digits, low, high, seen_low",
    [(1, 0, 9, True), (2, 10, 99, True), (4, 1000, 9999, False)],
)
def test_operands_have_exactly_the_requested_digits(digits, low, high, seen_low):
    tasks = make_arithmetic_tasks(digits=digits, terms=2, ops="+", count=1000, seed=0)
    values = [int(x) for t in tasks for x in operands_of(t["question"])]
    assert min(values) >= low and max(values) <= high
    assert all(len(str(v)) == digits for v in values)
    if seen_low:
        assert min(values) == low and max(values) == high


def test_negative_answers_carry_a_minus_sign():
    tasks = make_arithmetic_tasks(digits=1, terms=2, ops="-", count=100, seed=9)
    answers = {t["question"]: t["answer"] for t in tasks}
    assert answers["What is 3 - 8?"] == "-5"
    assert answers["What is 0 - 9?"] == "-9"
    assert answers["What is 9 - 0?"] == "9"
    assert sum(a.startswith("-") for a in answers.values()) == 45


def test_task_ids_and_schema():
    tasks = make_arithmetic_tasks(count=3, seed=12, prefix="warmup")
    assert [t["task_id"] for t in tasks] == [
        "warmup-s12-000000",
        "warmup-s12-000001",
        "warmup-s12-000002",
    ]
    for t in tasks:
        assert set(t) == {"task_id", "question", "answer"}
        assert all(isinstance(v, str) and v.strip() for v in t.values())
    assert make_arithmetic_tasks(count=1)[0]["task_id"] == "arith-s0-000000"


@pytest.mark.parametrize(
    "kwargs",
    [dict(digits=0), dict(terms=0), dict(count=0), dict(ops=""), dict(ops="+/")],
)
def test_generator_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        make_arithmetic_tasks(**kwargs)


# ---------------------------------------------------------------- spec strings

DEFAULTS = {"digits": 1, "terms": 2, "ops": "+", "count": 1000, "seed": 0, "max_operand": None}


def test_parse_spec_defaults_and_values():
    assert parse_arith_spec("arith") == DEFAULTS
    assert parse_arith_spec("arith:") == DEFAULTS
    assert parse_arith_spec("arith:digits=1,terms=2,ops=+-,count=500,seed=3") == {
        "digits": 1,
        "terms": 2,
        "ops": "+-",
        "count": 500,
        "seed": 3,
        "max_operand": None,
    }
    assert parse_arith_spec("arith:ops=*,digits=3") == {**DEFAULTS, "ops": "*", "digits": 3}
    assert parse_arith_spec("arith:max=20")["max_operand"] == 20


def test_max_operand_bounds_and_space():
    from nanorllm.datasets.arithmetic import arithmetic_space_size

    assert arithmetic_space_size(1, 2, "+-", max_operand=20) == 21 * 21 * 2
    tasks = load_tasks("arith:max=20,terms=2,ops=+-,count=882,seed=5")
    operands = [int(x) for t in tasks for x in t["question"][len("What is "):-1].split()[::2]]
    assert min(operands) == 0 and max(operands) == 20
    assert len({t["question"] for t in tasks}) == 882
    with pytest.raises(ValueError, match="max"):
        load_tasks("arith:max=0")


@pytest.mark.parametrize(
    "spec, key",
    [
        ("arith:size=3", "size"),
        ("arith:digits=two", "digits"),
        ("arith:count=1.5", "count"),
        ("arith:seed=", "seed"),
        ("arith:digits=0", "digits"),
        ("arith:terms=0", "terms"),
        ("arith:count=-4", "count"),
        ("arith:ops=", "ops"),
        ("arith:ops=+/", "ops"),
        ("arith:digits=1,digits=2", "digits"),
    ],
)
def test_parse_spec_errors_name_key_and_spec(spec, key):
    with pytest.raises(ValueError) as info:
        parse_arith_spec(spec)
    message = str(info.value)
    assert f"'{key}'" in message
    assert spec in message


def test_parse_spec_rejects_other_prefixes():
    with pytest.raises(ValueError, match="arithmetic"):
        parse_arith_spec("arithmetic")


def test_load_tasks_with_arith_spec():
    tasks = load_tasks("arith:digits=2,ops=+-,count=40,seed=3")
    assert tasks == make_arithmetic_tasks(digits=2, ops="+-", count=40, seed=3)
    first_five = make_arithmetic_tasks(count=40, seed=3)[:5]
    assert load_tasks("arith:count=40,seed=3", limit=5) == first_five
    assert len(load_tasks("arith")) == 1000


# ---------------------------------------------------------------- task files


def test_seed_format_converts_numeric_answers(tmp_path):
    path = write_lines(
        tmp_path / "seed.jsonl",
        [
            json.dumps({"task_id": "t-1", "question": "Two plus two?", "answer": 4}),
            "",
            json.dumps({"task_id": "t-2", "question": "Forty-two?", "answer": 42.0}),
            json.dumps({"task_id": "t-3", "question": "Half of five?", "answer": 2.5}),
            json.dumps({"task_id": "t-4", "question": "Minus one?", "answer": " -1 "}),
        ],
    )
    assert load_tasks(str(path)) == [
        {"task_id": "t-1", "question": "Two plus two?", "answer": "4"},
        {"task_id": "t-2", "question": "Forty-two?", "answer": "42"},
        {"task_id": "t-3", "question": "Half of five?", "answer": "2.5"},
        {"task_id": "t-4", "question": "Minus one?", "answer": "-1"},
    ]


def test_gsm8k_format_extracts_final_answer(tmp_path):
    path = write_lines(
        tmp_path / "mini_gsm.jsonl",
        [
            json.dumps({"question": "How many clips?", "answer": "48/2 = <<48/2=24>>24\n#### 72"}),
            "   ",
            json.dumps({"question": "How much money?", "answer": "Lots.\n#### 1,000"}),
            json.dumps({"question": "Which one?", "answer": "#### 3 wrong\nfixed:\n#### -7 "}),
        ],
    )
    assert load_tasks(str(path)) == [
        {"task_id": "mini_gsm-00001", "question": "How many clips?", "answer": "72"},
        {"task_id": "mini_gsm-00003", "question": "How much money?", "answer": "1000"},
        {"task_id": "mini_gsm-00004", "question": "Which one?", "answer": "-7"},
    ]


def test_limit_takes_first_tasks(tmp_path):
    path = write_lines(
        tmp_path / "seed.jsonl",
        [json.dumps({"task_id": f"t{i}", "question": f"q{i}", "answer": i}) for i in range(5)],
    )
    assert [t["task_id"] for t in load_tasks(str(path), limit=2)] == ["t0", "t1"]
    assert len(load_tasks(str(path), limit=50)) == 5
    with pytest.raises(ValueError):
        load_tasks(str(path), limit=0)


def test_bad_file_reports_every_problem(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = {"task_id": "a", "question": "q", "answer": "1"}
    lines = [
        json.dumps(good).encode(),  # 1
        json.dumps({"task_id": "b", "question": "q"}).encode(),  # 2 missing answer
        b'{"task_id": "c", "question": "q" "answer": "1"}',  # 3 invalid JSON
        json.dumps({"task_id": "d", "question": "  ", "answer": "1"}).encode(),  # 4 empty
        json.dumps({"task_id": "a", "question": "q2", "answer": "2"}).encode(),  # 5 duplicate id
        b'{"task_id": "e", "question": "caf\xff", "answer": "1"}',  # 6 bad byte
        b'["task_id", "f"]',  # 7 not an object
        json.dumps({"task_id": "g", "question": 12, "answer": "1"}).encode(),  # 8 wrong type
        json.dumps({"task_id": "h", "question": "q3", "answer": [1]}).encode(),  # 9 wrong type
        json.dumps({"task_id": "i", "question": "q4", "answer": 5}).encode(),  # 10 fine
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    label = str(path)
    with pytest.raises(TaskFileError) as info:
        load_tasks(label)
    err = info.value
    assert err.problems == [
        f"{label}:2: field 'answer' is missing",
        f"{label}:3: invalid JSON (Expecting ',' delimiter at column 34)",
        f"{label}:4: field 'question' is empty",
        f"{label}:5: field 'task_id' duplicates line 1 ('a')",
        f"{label}:6: not valid UTF-8 (byte 0xff at offset 33)",
        f"{label}:7: expected a JSON object, got list",
        f"{label}:8: field 'question' must be a string, got int",
        f"{label}:9: field 'answer' must be a string or number, got list",
    ]
    assert str(err).splitlines() == [f"8 problems in tasks file {label}:", *err.problems]


def test_gsm8k_file_without_final_answer_line(tmp_path):
    path = write_lines(
        tmp_path / "gsm.jsonl",
        [
            json.dumps({"question": "q1", "answer": "work\n#### 5"}),
            json.dumps({"question": "q2", "answer": "work but no final line"}),
            json.dumps({"question": "q3"}),
            json.dumps({"question": "q4", "answer": "work\n####  "}),
        ],
    )
    with pytest.raises(TaskFileError) as info:
        load_tasks(str(path))
    assert info.value.problems == [
        f"{path}:2: field 'answer' has no '#### <answer>' line",
        f"{path}:3: field 'answer' is missing",
        f"{path}:4: field 'answer' is empty after '####'",
    ]


def test_missing_file(tmp_path):
    path = str(tmp_path / "nope.jsonl")
    with pytest.raises(TaskFileError) as info:
        load_tasks(path)
    assert len(info.value.problems) == 1
    assert path in info.value.problems[0]
    assert str(info.value).startswith(f"1 problem in tasks file {path}:")


@pytest.mark.parametrize("content", [b"", b"\n  \n\n"])
def test_empty_file(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    with pytest.raises(TaskFileError) as info:
        load_tasks(str(path))
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith(f"{path}: ")


def test_real_gsm8k_train_split():
    if not GSM8K_TRAIN.is_file():
        pytest.skip(f"{GSM8K_TRAIN} is absent")
    tasks = load_tasks(str(GSM8K_TRAIN))
    assert len(tasks) == 7473
    assert tasks[0]["task_id"] == "train-00001"
    assert tasks[0]["question"].startswith("Natalia sold clips")
    assert tasks[0]["answer"] == "72"
    assert tasks[-1]["task_id"] == "train-07473"
    assert len({t["task_id"] for t in tasks}) == 7473
    assert all("," not in t["answer"] and "#" not in t["answer"] for t in tasks)


# ---------------------------------------------------------------- overlap


def test_remove_overlap_drops_heldout_questions_and_ids():
    train = [
        {"task_id": "tr-1", "question": "What is  2 + 2?", "answer": "4"},
        {"task_id": "tr-2", "question": "How many APPLES\ndoes Sam have? ", "answer": "3"},
        {"task_id": "tr-3", "question": "A fresh question", "answer": "1"},
        {"task_id": "te-9", "question": "Reused id", "answer": "1"},
        {"task_id": "tr-5", "question": "What is 2 + 3?", "answer": "5"},
    ]
    heldout = [
        {"task_id": "te-1", "question": "what is 2 + 2?", "answer": "4"},
        {"task_id": "te-2", "question": "How many apples does Sam have?", "answer": "3"},
        {"task_id": "te-9", "question": "Something else", "answer": "0"},
    ]
    kept, dropped = remove_overlap(train, heldout)
    assert [t["task_id"] for t in kept] == ["tr-3", "tr-5"]
    assert dropped == 3
    assert remove_overlap(train, []) == (train, 0)
