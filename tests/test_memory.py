"""The memory plan: exact parameter counts from a config alone, the KV cache's bytes as the cache counts
them, and runs the plan refuses at start (exit 2, nothing loaded, nothing written) or only prints."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

from nanorllm.config import TrainConfig
from nanorllm.memory.plan import GB, kv_bytes, largest_micro_batch, model_config, parameter_counts, plan_run
from nanorllm.memory.tasks import TaskShape, task_shape
from nanorllm.policy.byte_tokenizer import tiny_tokenizer
from nanorllm.policy.lora import LoraSpec, add_adapters, trainable_parameters
from nanorllm.policy.models import tiny_model
from nanorllm.policy.slot_cache import _LIBC, cache_bytes
from nanorllm.run.assembly import assemble
from nanorllm.utils.devices import DeviceMap
from tests import forked
from tests.procs import HANG_S, ROOT, child_env

TRAIN = [sys.executable, str(ROOT / "launch" / "train.py")]
CPU = DeviceMap(learners=["cpu"], workers=["cpu"])


def on(cfg: TrainConfig, devices: DeviceMap = CPU):
    """`cfg` assembled as a run (its env, tasks and LoRA spec) on `devices`: what the plan is handed."""
    parts = assemble(cfg)
    parts.devices = devices
    return parts


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        return int(dict(line.split(":", 1) for line in f)["MemAvailable"].split()[0]) * 1024


def test_parameter_counts_from_the_config_alone_equal_the_built_models():
    model = tiny_model(tiny_tokenizer())
    assert parameter_counts(model_config("tiny-random"), None) == (sum(p.numel() for p in model.parameters()),) * 2
    spec = LoraSpec(rank=4, alpha=8.0)
    total, trainable = parameter_counts(model_config("tiny-random"), spec)
    peft = add_adapters(model, spec, base_name="tiny-random")
    assert trainable == sum(p.numel() for _, p in trainable_parameters(peft))
    assert total == sum(p.numel() for p in peft.parameters())


def test_the_default_model_and_presets_are_counted_without_weights():
    assert parameter_counts(model_config("smollm2-135m-instruct"), None)[0] == 134_515_008
    assert parameter_counts(model_config("preset:qwen2.5-1.5b"), None)[0] == 1_543_714_304


def test_kv_bytes_are_the_slot_caches():
    model = tiny_model(tiny_tokenizer())
    for slots, width in [(9, 128), (257, 448)]:
        assert kv_bytes(model.config, slots=slots, width=width, dtype_bytes=2) == \
            cache_bytes(model, slots=slots, width=width, dtype=torch.bfloat16)


def test_the_plan_sums_weights_grads_adam_and_refuses_what_the_host_cannot_hold():
    cfg = TrainConfig(model="preset:qwen2.5-1.5b")
    plan = plan_run(on(cfg), free={"cpu": 200 * 10**9}, shm_free=100 * 10**9)
    learner = {p.name: p.nbytes for p in plan.processes[0].parts}
    n = 1_543_714_304
    assert (learner["weights"], learner["grads"], learner["adam"]) == (4 * n, 4 * n, 8 * n)
    assert plan.shm_bytes == 4 * n  # the CPU learner's fp32 parameters are the shared block, counted once
    assert plan.problems() == []
    small = plan_run(on(cfg), free={"cpu": 16 * 10**9}, shm_free=100 * 10**9)
    [problem] = small.problems()
    assert "activations learner" in problem and "adam learner" in problem and "--lora-rank" in problem
    lora = plan_run(on(TrainConfig(model="preset:qwen2.5-1.5b", lora_rank=16, dtype="bf16")),
                    free={"cpu": 200 * 10**9}, shm_free=100 * 10**9)
    parts = {p.name: p.nbytes for p in lora.processes[0].parts}
    assert parts["adam"] < 0.02 * learner["adam"] and parts["weights"] < 0.55 * learner["weights"]
    assert lora.shm_bytes == parts["grads"]  # only the fp32 adapters are shared


def test_the_first_prompts_are_measured_as_the_rollout_renders_them():
    from nanorllm.policy.hf_causal import HFCausalPolicy

    parts = assemble(TrainConfig(model="tiny-random"))
    shape = task_shape(parts)
    policy = HFCausalPolicy.from_name("tiny-random")
    env, tasks = parts.env, parts.train_tasks[:8]  # the run's own loaded tasks, as the plan reads them
    prompts = []
    for t in tasks:
        agent = env.make_agent()
        agent.reset(t, t["question"])
        prompts.append(policy.first_prompt_ids(agent.messages))
    assert shape.first == max(map(len, prompts))
    n = shape.shared
    assert 0 < n < min(map(len, prompts)) and len({tuple(p[:n]) for p in prompts}) == 1
    assert len({p[n] for p in prompts}) > 1  # the longest common prefix, not a shorter one
    assert shape.eval_tasks == 200  # the math env's held-out set
    assert task_shape(assemble(TrainConfig(model="tiny-random", eval_limit=8,
                                           eval_set=("a=arith:count=20,seed=3",)))).eval_tasks == 8
    assert task_shape(assemble(TrainConfig(model="/no/such/model"))) is None  # no tokenizer without loading: the guess


def test_the_learners_kv_cache_holds_every_held_out_episode_at_once():
    config = model_config("tiny-random")
    def learner_kv(cfg, eval_tasks):
        plan = plan_run(on(cfg), config=config, free={"cpu": 10**12}, shm_free=10**12,
                        tasks=TaskShape(first=84, shared=71, eval_tasks=eval_tasks))
        return {p.name: p.nbytes for p in plan.processes[0].parts}["kv"]
    kv = lambda slots: kv_bytes(config, slots=slots, width=320, dtype_bytes=4)  # 84 + 2 x 32 + 128 -> 320
    assert learner_kv(TrainConfig(), 200) == kv(201)  # 200 held-out tasks decode at once (the engine's slots + 1)
    assert learner_kv(TrainConfig(eval_samples=4), 200) == kv(257)  # 800 episodes, --max-batch-episodes 256 at once
    assert learner_kv(TrainConfig(), 8) == kv(9)
    assert learner_kv(TrainConfig(serial=True), 8) == kv(33)  # its rollouts: 8 tasks x 4 samples
    assert learner_kv(TrainConfig(), None) == kv(257)  # not measured: the most the engine decodes at once


def test_the_largest_micro_batch_counts_the_shared_prefix_once_and_what_a_step_can_fill():
    cfg = TrainConfig()  # 8 tasks x 4 samples, 2 turns of 32 tokens
    mb = largest_micro_batch(cfg, budget=4096, width=276, shared=71)
    assert (mb.rows, mb.tokens, mb.scored) == (14, 14 * 205 + 71, 14 * 64)  # 4096 // 276 = 14 rows
    assert largest_micro_batch(TrainConfig(tasks_per_step=2, num_samples_per_task=2), budget=4096, width=276,
                               shared=71).rows == 4  # a step of 4 episodes fills no more
    ckpt = largest_micro_batch(TrainConfig(grad_checkpointing=True), budget=4096, width=276, shared=71)
    assert (ckpt.shared, ckpt.tokens) == (0, 14 * 276)  # checkpointed layers get no shared KV: each row its prefix
    assert largest_micro_batch(cfg, budget=4096, width=5000, shared=71).tokens == 5000  # one long row, alone
    big = plan_run(on(cfg), config=model_config("tiny-random"), free={"cpu": 10**12}, shm_free=10**12,
                   tasks=TaskShape(first=84, shared=71))
    small = plan_run(on(cfg), config=model_config("tiny-random"), free={"cpu": 10**12}, shm_free=10**12,
                     tasks=TaskShape(first=84, shared=0))
    act = {p.name: p.nbytes for p in big.processes[0].parts}["activations"]
    assert act < {p.name: p.nbytes for p in small.processes[0].parts}["activations"]
    assert "15 x 273 tokens, 71 shared" in big.table()  # the prompts start at 84: rows of 273 fill 4096 closer


def test_shorter_rows_that_fill_the_budget_closer_than_the_longest_make_the_largest_pass():
    # a game's rows: 1,071 tokens at most, 300 at least; 3 of the longest fill 3,213 of 4,096, 8 of 512 all of it
    # (each with at most 212 response tokens after its 300-token prompt: more than 4 rows of 1,024 score)
    cfg = TrainConfig(max_turns=5, max_new_tokens=64)
    mb = largest_micro_batch(cfg, budget=4096, width=1071, shared=0, shortest=300)
    assert (mb.rows, mb.width, mb.tokens, mb.scored) == (8, 512, 4096, 8 * 212)
    assert largest_micro_batch(cfg, budget=4096, width=1071, shared=0).tokens == 3 * 1071  # without a shortest
    short = largest_micro_batch(TrainConfig(max_turns=2, max_new_tokens=32), budget=4096, width=300, shared=0,
                                shortest=100)
    assert short.tokens <= 4096 and short.scored <= short.rows * 64  # no row scores more than its turns' tokens
    # a step of 2 games x 2 samples under self-play has 8 episodes (one a seat), not 4
    few = TrainConfig(tasks_per_step=2, num_samples_per_task=2)
    assert largest_micro_batch(few, budget=4096, width=256, shared=0, seats=2).rows == 8
    assert largest_micro_batch(few, budget=4096, width=256, shared=0).rows == 4


def test_a_small_dev_shm_is_named_with_the_container_setting():
    plan = plan_run(on(TrainConfig()), free={"cpu": 100 * 10**9}, shm_free=64 * 2**20)
    [problem] = plan.problems()
    assert "/dev/shm" in problem and "--shm-size" in problem and "--ipc=host" in problem
    assert plan_run(on(TrainConfig(serial=True), DeviceMap(["cpu"], [])), free={"cpu": 100 * 10**9},
                    shm_free=64 * 2**20).problems() == []  # one process: no shared block


@pytest.mark.slow
def test_memory_plan_only_prints_the_table_and_writes_nothing(tmp_path):
    r = forked.run([*TRAIN, "--model", "tiny-random", "--memory-plan-only", "--output-dir", str(tmp_path / "runs")],
                   env=child_env(), capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == 0, r.stderr
    assert "[memory] learner cpu: weights" in r.stdout and "| worker 0 cpu:" in r.stdout and "/dev/shm:" in r.stdout
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.skipif(mem_available() > 50 * GB, reason="this host could hold a 1.5B fp32 full fine-tune's plan")
def test_a_full_fine_tune_of_1_5b_in_fp32_is_refused_in_seconds_before_loading(tmp_path):
    """Refused from the plan alone: nothing loads (no [models] or [engine] line), which is what keeps it
    to seconds; no clock is read, as a busy machine's imports alone can take a minute."""
    r = forked.run([*TRAIN, "--model", "preset:qwen2.5-1.5b", "--output-dir", str(tmp_path / "runs")],
                   env=child_env(), capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == 2, r.stderr
    [line] = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert "adam learner" in line and "--lora-rank" in line and "--grad-checkpointing" in line
    assert "[models]" not in r.stdout and "[engine]" not in r.stdout  # nothing loaded
    assert not (tmp_path / "runs").exists()


def unshare_allowed() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not unshare_allowed(), reason="needs root and unshare -m for a private /dev/shm")
def test_a_64_mb_dev_shm_refuses_the_default_pipeline_before_anything_is_written(tmp_path):
    runs = tmp_path / "runs"
    script = (f"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {sys.executable} {ROOT / 'launch' / 'train.py'} "
              f"--output-dir {runs} --run-name r")
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], env=child_env(), capture_output=True, text=True,
                       timeout=HANG_S)
    assert r.returncode == 2, r.stderr
    [line] = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert "0.54 GB of /dev/shm, 0.07 GB" in line and "--shm-size" in line and "--ipc=host" in line
    assert "Traceback" not in r.stderr and not runs.exists()


def run_with_fault(tmp_path, fault: str, *args: str) -> subprocess.CompletedProcess:
    from tests.procs import train_command

    return forked.run(train_command([*args, "--run-name", "r"], tmp_path), env=child_env(fault=fault),
                      capture_output=True, text=True, timeout=HANG_S)


@pytest.mark.slow
def test_a_learner_out_of_memory_says_so_with_the_step_and_the_plan_and_saves_the_last_step(tmp_path):
    r = run_with_fault(tmp_path, "learner_oom:2", "--serial", "--max-steps", "3")
    assert r.returncode == 1, r.stderr
    [line] = [x for x in r.stderr.splitlines() if x.startswith("[failed] out of memory")]
    assert line.startswith("[failed] out of memory at step 2; the plan was: [memory] learner cpu: weights")
    assert "--grad-checkpointing" in line
    assert (tmp_path / "r" / "checkpoints" / "step_1").is_dir() and not (tmp_path / "r" / "final_model").exists()


@pytest.mark.slow
def test_a_worker_out_of_memory_is_said_and_the_worker_restarts(tmp_path):
    r = run_with_fault(tmp_path, "worker_oom", "--num-workers", "1", "--max-steps", "2", "--restart-backoff-s", "0.2")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "out of memory on cpu" in out and "restarting it in" in out
    assert (tmp_path / "r" / "final_model").is_dir()


HELD_HEAP = """
import gc, sys, torch
from nanorllm.config import TrainConfig
from nanorllm.memory.plan import model_config, plan_run
from nanorllm.policy import slot_cache
from nanorllm.run.assembly import assemble

def rss_mb():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) / 1024

if sys.argv[1] == "keep":
    slot_cache._LIBC = None  # the control: nothing handed back
x = torch.ones(16 << 20, dtype=torch.uint8); del x  # glibc raises its mmap threshold past 8 MB
big, pins = [torch.ones(8 << 20, dtype=torch.uint8) for _ in range(50)], []
for t in big:
    pins.append(torch.ones(64))  # a small live block after each: the freed ones cannot be trimmed off the top
del big; gc.collect()
held = rss_mb()
plan_run(assemble(TrainConfig(model="tiny-random", serial=True)), config=model_config("tiny-random"))
print(held, rss_mb())
"""


@pytest.mark.slow
def test_the_plan_counts_what_an_earlier_run_in_the_process_freed_as_free():
    # 400 MB freed in this process but kept in glibc's heap (an earlier run's, in a benchmark's table):
    # MemAvailable cannot see them until the plan hands them back
    rss = {}
    for mode in ("keep", "release"):
        r = subprocess.run([sys.executable, "-c", HELD_HEAP, mode], env=child_env(), capture_output=True, text=True,
                           timeout=HANG_S)
        assert r.returncode == 0, r.stderr
        rss[mode] = tuple(map(float, r.stdout.split()))
    (held, kept), (_, released) = rss["keep"], rss["release"]
    assert held > 450 and kept > held - 20, rss  # without handing back, the plan's process still holds them
    assert kept - released > 350, rss


def test_an_agent_runs_rows_are_planned_at_the_endpoints_bound_not_at_the_tasks_prompts(tmp_path):
    """An --agent writes its own prompts: the plan sizes its KV slots and micro-batches at the row limit the
    endpoint enforces (--max-prompt-tokens plus the turns' room; else the model's context), not at the
    prompts the tasks render."""
    from nanorllm.config.specs import agent_row_tokens

    (tmp_path / "agent.py").write_text("def agent(task, client):\n    return 0.0\n")
    common = dict(model="tiny-random", tasks="calc:count=8,seed=1", eval_tasks="", max_turns=2, max_new_tokens=32)

    def kv(cfg):
        plan = plan_run(on(cfg), free={"cpu": 10**12}, shm_free=10**12)
        return next(part for part in plan.processes[0].parts if part.name == "kv")

    bounded = TrainConfig(agent=f"{tmp_path / 'agent.py'}:agent", max_prompt_tokens=1200, **common)
    assert agent_row_tokens(bounded) == 1200 + 2 * 32 + 128
    env_run, agent_run = kv(TrainConfig(env="calc", max_prompt_tokens=1200, **common)), kv(bounded)
    config = model_config("tiny-random")
    slots = 1  # no held-out set, no --serial: the learner's one eval slot
    assert agent_run.nbytes == kv_bytes(config, slots=slots, width=1408, dtype_bytes=4)  # 1392 -> 1408 columns
    assert "agent rows of up to 1408 tokens" in agent_run.note
    assert env_run.nbytes < agent_run.nbytes  # the calc prompts are far shorter than the bound
    unbounded = kv(TrainConfig(agent=f"{tmp_path / 'agent.py'}:agent", **common))
    context = config.max_position_embeddings
    assert unbounded.nbytes == kv_bytes(config, slots=slots, width=-(-context // 64) * 64, dtype_bytes=4)


TRIM_CHILD = """
import torch
from nanorllm.policy.slot_cache import trim_host_heap
def rss():
    return int(dict(l.split(":", 1) for l in open("/proc/self/status"))["VmRSS"].split()[0]) * 1024
held = [torch.ones(16384) for _ in range(4000)]  # 64 KiB blocks: glibc's heap, under its mmap threshold
del held[::2]  # 125 MiB freed in holes between live blocks: glibc keeps them resident
before = rss()
trim_host_heap(torch.device("cpu"))
print((before - rss()) // 2**20)
"""


@pytest.mark.slow  # a child process
@pytest.mark.skipif(_LIBC is None, reason="glibc's malloc_trim: nothing to hand back elsewhere")
def test_trimming_the_heap_hands_the_freed_holes_back_to_the_system():
    # what lets a learner whose passes change size hold one pass's memory, not the sum of their holes
    out = subprocess.run([sys.executable, "-c", TRIM_CHILD], capture_output=True, text=True, timeout=HANG_S,
                         cwd=ROOT, env=child_env())
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) >= 60  # MiB resident before the trim and not after
