"""A memory plan before anything loads: what each process of a run will hold, and whether it fits.

Out-of-memory is otherwise learnt from a crash minutes in (or from the kernel's OOM killer, silently).
The plan counts, per process, from the model's config alone (the model built on the `meta` device:
exact parameter counts, no weights):

    learner   weights (fp32 masters, + under bf16 the update's bf16 copies of them; under LoRA the frozen base
              in --dtype + fp32 adapters),
              grads and AdamW's two moments (of what trains), activations of the largest
              micro-batch, the slot KV cache of its own decoding (the held-out eval, every episode at
              once up to --max-batch-episodes; --serial's rollouts)
    worker i  its replica (in --dtype), its slot KV cache
    + a --reward-model (weights and one batch's forward) in every process that scores: each worker, and the
              learner where it rolls out (--serial) or evaluates held-out tasks; on --reward-model-device if given
    /dev/shm  the shared weight block (pipeline/weights.py): on a CPU learner whose parameters are
              stored in the replica dtype it IS the learner's weights, counted once

and a process's runtime (Python, torch, transformers: RUNTIME_BYTES), which is host memory whatever the
process's device, plus a CUDA context (CUDA_CONTEXT_BYTES) on each CUDA device a process uses. Everything on
the host (CPU processes' parts, every runtime, the /dev/shm block) shares what the host has available for
this process: the least of MemAvailable and its memory cgroups' limits (policy/slot_cache.py
`host_memory`); a CUDA device's parts are held against its `mem_get_info`. The activation
figure is what each decoder layer's forward saves for the backward, per token (`saved_layer_bytes`: measured
with saved-tensor hooks on two model families, tests/test_memory_saved.py) plus the head's logits and their
gradient at the scored tokens only (the head gather), in the compute dtype, and one block of the loss's fp32
log-softmax (trainer/logprobs.py):
what a backward keeps alive at its peak, not the CUDA micro-batch sizing's deliberately high bound.
It is counted for the largest micro-batch the run can form: as many episodes of one width as the token
budget holds, at the width between the first prompt (measured with the tokenizer, memory/tasks.py) and the
longest episode (every turn's response at --max-new-tokens) whose pass computes the most tokens, the
prompt's shared leading tokens once (the shared-prefix forward; none in a game, whose seats are shown
different prompts), each row's responses scored. A supervised run's plan (memory/sft_plan.py) is its
learner alone, from the same parts.
"""

import os
import shutil
from dataclasses import dataclass, field

import torch

from nanorllm.memory.tasks import TaskShape, task_shape
from nanorllm.rewards.sources import HeldModel, reward_source_models
from nanorllm.rollout.games import MODEL_FREE
from nanorllm.trainer.logprobs import rows_per_block
from nanorllm.trainer.micro_batches import CPU_MICRO_BATCH_TOKENS
from nanorllm.trainer.parts import RunParts
from nanorllm.utils.precision import resolve as resolve_precision

UNKNOWN = 1 << 62  # a free figure nothing could read (policy/slot_cache.py)

RUNTIME_BYTES = 350 * 2**20  # VmHWM of a process that imported torch, transformers and nanorllm (measured here)
# A CUDA context's device memory (kernels, cuBLAS workspace), not measured on this CPU-only machine: torch 2.x
# with lazy module loading takes a few hundred MB on recent GPUs; 500 MiB errs on the side of refusing.
CUDA_CONTEXT_BYTES = 500 * 2**20
# Values one decoder layer's forward keeps alive per token (saved for the backward when it trains; a no-grad
# forward's peak, one layer at a time, otherwise): the attention's and the MLP's own and every Linear's input.
LAYER_SAVED_PER_HIDDEN, LAYER_SAVED_PER_INTERMEDIATE = 10, 4
# Under bf16 autocast over fp32 masters the residual stream and the RMSNorms' math stay fp32: 4 x hidden fp32
# values more a layer (measured: 16.1 bytes a hidden unit on SmolLM2's and Qwen2.5's shapes).
AUTOCAST_FP32_PER_HIDDEN = 4
# Under LoRA the frozen base's Linears keep no input: the attention's and MLP's own values in the compute dtype,
# the RMSNorms' fp32 math, and each adapter its input and its A output (rank wide) in fp32 (peft casts the input
# to the adapter's dtype: under bf16 a copy each; in fp32 the adapters that read one input share it).
LORA_BASE_PER_HIDDEN, LORA_BASE_PER_INTERMEDIATE, LORA_FP32_PER_HIDDEN = 4, 3, 2
# The head at the scored tokens: its logits (the compute dtype) kept for the backward and their gradient; the
# loss's fp32 log-softmax runs a block of rows at a time (trainer/logprobs.py), up to this many block-sized
# fp32 tensors alive at once (the upcast, the scaled logits and the log-softmax; then log p, p and a product).
HEAD_COPIES_PER_VOCAB, HEAD_BLOCK_COPIES = 2, 3
# with --grad-checkpointing a layer keeps its input (the residual stream: fp32 but for a LoRA base stored in bf16);
# one layer is recomputed at a time
CHECKPOINTED_PER_HIDDEN = 1
FIRST_PROMPT_TOKENS = 256  # a first prompt's length where it cannot be measured (memory/tasks.py)
FIT_SHARE = 0.9  # of what a device or /dev/shm has free: the allocator's slack
GB = 1e9
SHRINK_LEARNER = "--lora-rank 16, --dtype bf16, --grad-checkpointing, --micro-batch-tokens"  # a refusal names them
SHRINK_RUN = f"{SHRINK_LEARNER}, --max-batch-episodes, --num-workers"


class MemoryPlanError(ValueError):
    """The plan does not fit this machine: the message names the biggest parts and the flags that shrink them."""


def model_config(name: str):
    """The transformers config of a model name, without loading weights; None where it cannot be read
    without loading (a peft adapter folder, a hub id not cached)."""
    from transformers import AutoConfig, LlamaConfig

    from nanorllm.policy.byte_tokenizer import tiny_tokenizer
    from nanorllm.policy.models import SMOLLM2, TINY, cache_dir
    from nanorllm.policy.presets import PRESETS, PREFIX, is_preset

    if is_preset(name):
        key = name.removeprefix(PREFIX)
        if key not in PRESETS:
            return None
        _, config_cls, shape = PRESETS[key]
        return config_cls(**shape)
    if name == TINY:
        return LlamaConfig(vocab_size=len(tiny_tokenizer()), hidden_size=64, intermediate_size=128,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    if name == SMOLLM2:
        cached = cache_dir() / SMOLLM2
        if (cached / "config.json").exists():
            return AutoConfig.from_pretrained(cached)
        _, config_cls, shape = PRESETS["smollm2-135m"]  # the GGUF's architecture, not yet converted
        return config_cls(**shape)
    if os.path.isfile(os.path.join(name, "adapter_config.json")):
        return None
    try:
        return AutoConfig.from_pretrained(name, trust_remote_code=False)
    except Exception:
        return None


def parameter_counts(config, lora) -> tuple[int, int]:
    """(every parameter, those that train) of the model `config` describes, counted on the meta device;
    `lora` a LoraSpec (its adapters train) or None (everything trains)."""
    model = meta_model(config)
    total = sum(p.numel() for p in model.parameters())
    if lora is None:
        return total, total
    adapters = sum(lora.rank * (m.in_features + m.out_features) for _, m in adapted_linears(model, lora))
    return total + adapters, adapters


def meta_model(config) -> torch.nn.Module:
    """The causal LM `config` describes, built on the meta device: its shapes, no weights."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def adapted_linears(model: torch.nn.Module, lora) -> list[tuple[str, torch.nn.Linear]]:
    """(name, Linear) of every layer `lora`'s adapters wrap (policy/lora.py target_names; never the head)."""
    from nanorllm.policy.lora import target_names

    leaves = set(target_names(model, lora.targets))
    return [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
            and n.rsplit(".", 1)[-1] in leaves and m is not model.get_output_embeddings()]


@dataclass
class Part:
    name: str
    nbytes: int
    note: str = ""
    device: str | None = None  # where it is held when not on its process's device (a runtime, the shm block: "cpu")


@dataclass
class Process:
    name: str  # "learner", "worker 0", ...
    device: str
    parts: list[Part] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def line(self) -> str:
        parts = ", ".join(f"{p.name} {p.nbytes / GB:.2f}{f' ({p.note})' if p.note else ''}" for p in self.parts)
        return f"{self.name} {self.device}: {parts} = {self.total / GB:.2f} GB"


@dataclass
class MemoryPlan:
    processes: list[Process]
    shm_bytes: int  # the shared weight block(s) in host shared memory
    shm_free: int
    free: dict[str, int]  # bytes free per device ("cpu": what the host has available for this process)
    micro_batch_tokens: int
    shrink: str  # the flags that shrink the plan, named by a refusal (SHRINK_RUN, SHRINK_LEARNER)
    host_source: str = "MemAvailable"  # where the host's figure came from (a cgroup's limit file, ...)

    def held(self):
        """(device, process, part) of every part, on the device that holds it."""
        return [(p.device if part.device is None else part.device, p, part) for p in self.processes for part in p.parts]

    def need(self) -> dict[str, int]:
        """Bytes planned per device; /dev/shm pages are host memory too (counted in the learner's weights
        where they are the learner's parameters, else as a part of their own on "cpu")."""
        out: dict[str, int] = {}
        for device, _, part in self.held():
            out[device] = out.get(device, 0) + part.nbytes
        return out

    def table(self) -> str:
        cells = [p.line() for p in self.processes]
        cells.append(f"/dev/shm: {self.shm_bytes / GB:.2f} of {self.shm_free / GB:.1f} GB free")
        cells += [(f"machine {f / GB:.1f} GB free ({self.host_source})" if f < UNKNOWN else
                   "machine free memory unknown (not checked)") if d == "cpu" else f"{d} {f / GB:.1f} GB free"
                  for d, f in self.free.items()]
        return "[memory] " + " | ".join(cells)

    def problems(self) -> list[str]:
        """What does not fit, each with its figures, the biggest parts and the flags that shrink them."""
        out = []
        for device, need in self.need().items():
            free = self.free.get(device, UNKNOWN)
            if need > FIT_SHARE * free:
                parts = sorted(((f"{part.name} {pr.name}", part.nbytes) for d, pr, part in self.held() if d == device),
                               key=lambda x: -x[1])[:3]
                biggest = ", ".join(f"{n} {b / GB:.2f} GB" for n, b in parts)
                where = (f"the host (all CPU processes, every runtime; {self.host_source})" if device == "cpu"
                         else device)
                out.append(f"the plan needs {need / GB:.1f} GB on {where}, "
                           f"{free / GB:.1f} GB is free there; biggest: {biggest}. Shrink it with {self.shrink}")
        if self.shm_bytes > FIT_SHARE * self.shm_free:
            out.append(f"the shared weight block needs {self.shm_bytes / GB:.2f} GB of /dev/shm, {self.shm_free / GB:.2f} GB "
                       f"is free there; enlarge /dev/shm (a container: docker run --shm-size=2g, or --ipc=host), "
                       f"or shrink the block with --dtype bf16 or --lora-rank 16, or run --serial (no shared block)")
        return out


def check_plan(plan: MemoryPlan | None, model: str, *, plan_only: bool, quiet: bool = False) -> bool:
    """Print `plan` (one line; quiet: only under `plan_only`) and say whether the program goes on: False under
    --memory-plan-only (the caller stops, exit 0); MemoryPlanError, naming the figures, where it does not fit.
    A plan of None (`model`'s config cannot be read without loading it) is said and lets the program go on."""
    if plan is None:
        if not quiet or plan_only:
            print(f"[memory] no plan: the config of {model!r} cannot be read without loading it", flush=True)
        return not plan_only
    if not quiet or plan_only:
        print(plan.table(), flush=True)
    if plan_only:
        return False
    problems = plan.problems()
    if problems:
        raise MemoryPlanError("; ".join(problems))
    return True


def free_bytes(device: str) -> int:
    """CUDA's free memory on `device`, or what the host has available for this process (host_memory)."""
    from nanorllm.policy.slot_cache import free_memory

    return free_memory(torch.device(device))


def read_free(devices: set[str]) -> tuple[dict[str, int], str]:
    """(bytes free per device, where the host's figure came from): CUDA's free memory, and what the host has
    available for this process (host_memory), each after this process handed back what it freed."""
    from nanorllm.policy.slot_cache import host_memory, release_freed

    free = {d: free_bytes(d) for d in sorted(devices) if d != "cpu"}
    release_freed(torch.device("cpu"))  # as free_bytes does: what this process freed counts as free
    free["cpu"], source = host_memory()
    return free, source


def shm_free_bytes(path: str = "/dev/shm") -> int:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 1 << 62


def intermediate_size(config) -> int:
    return getattr(config, "intermediate_size", None) or 4 * config.hidden_size


def layer_bytes(config, dtype_bytes: int) -> int:
    """Bytes one decoder layer's forward keeps alive per token with every value in one dtype: a no-grad forward's
    (prefill, a teacher's, a reward model's), and what a layer saves for the backward in fp32."""
    return (LAYER_SAVED_PER_HIDDEN * config.hidden_size + LAYER_SAVED_PER_INTERMEDIATE * intermediate_size(config)) \
        * dtype_bytes


def saved_layer_bytes(config, *, dtype_bytes: int, lora=None) -> int:
    """Bytes one decoder layer's forward saves for the backward per token, as the learner runs it: every weight
    trained (fp32, or bf16 autocast over fp32 masters: its residual stream and norms in fp32), or under `lora` (a
    LoraSpec) a frozen base in the compute dtype and fp32 adapters (the constants above)."""
    hidden, inter = config.hidden_size, intermediate_size(config)
    if lora is None:
        autocast = AUTOCAST_FP32_PER_HIDDEN * hidden * 4 if dtype_bytes < 4 else 0
        return layer_bytes(config, dtype_bytes) + autocast
    adapters = adapted_linears(meta_model(config), lora)
    if dtype_bytes < 4:  # each adapter its own fp32 copy of its input
        inputs = sum(m.in_features for _, m in adapters)
    else:  # one copy of each input: the adapters of one module reading one width share it (q, k, v: the same)
        inputs = sum(width for _, width in {(n.rsplit(".", 1)[0], m.in_features) for n, m in adapters})
    adapter_values = (inputs + lora.rank * len(adapters)) / config.num_hidden_layers
    base = (LORA_BASE_PER_HIDDEN * hidden + LORA_BASE_PER_INTERMEDIATE * inter) * dtype_bytes
    return int(base + (LORA_FP32_PER_HIDDEN * hidden + adapter_values) * 4)


def prefill_bytes(config, *, rows: int, tokens: int, dtype_bytes: int) -> int:
    """A decode batch's joint prefill (policy/slot_batch.py: every joining row in one no-grad forward, one
    layer's values alive at a time) of `rows` rows of `tokens` new tokens each."""
    return rows * tokens * layer_bytes(config, dtype_bytes)


def compute_bytes(dtype: str, device: str) -> int:
    """Bytes per value in the compute dtype (--dtype; auto: as utils/precision.py chooses it for `device`)."""
    return 2 if resolve_precision(dtype, device) == "bfloat16" else 4


def budget_tokens(micro_batch_tokens: int | None) -> int:
    """The token budget of a micro-batch the plan counts: --micro-batch-tokens, else the CPU learner's own size."""
    return micro_batch_tokens or CPU_MICRO_BATCH_TOKENS


def trained_parts(total: int, trainable: int, *, lora: bool, dtype_bytes: int) -> list[Part]:
    """A learner's weights (fp32 masters, plus under bf16 the update's held bf16 copies of its Linear weights,
    trainer/held_weights.py, counted as every parameter: at most that; under LoRA the frozen base in the compute
    dtype and fp32 adapters), grads and AdamW's two moments (fp32, of what trains)."""
    held = total * dtype_bytes if dtype_bytes < 4 else 0
    weights = total * 4 + held if not lora else (total - trainable) * dtype_bytes + trainable * 4
    return [Part("weights", weights), Part("grads", trainable * 4), Part("adam", trainable * 8)]


def activation_bytes(config, tokens: int, *, scored: int, dtype_bytes: int, checkpointing: bool, lora=None) -> int:
    """Bytes a forward/backward keeps alive at its peak (module docstring): `tokens` computed through the
    decoder, `scored` of them through the head; `lora` the run's LoraSpec or None."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    layer = saved_layer_bytes(config, dtype_bytes=dtype_bytes, lora=lora)
    residual = dtype_bytes if lora is not None else 4  # a LoRA base is stored in the compute dtype, else fp32 masters
    body = (layers * CHECKPOINTED_PER_HIDDEN * hidden * residual + layer) if checkpointing else layers * layer
    return int(tokens * body + head_bytes(config.vocab_size, scored, dtype_bytes=dtype_bytes))


def head_bytes(vocab: int, scored: int, *, dtype_bytes: int, copies: int = HEAD_COPIES_PER_VOCAB) -> int:
    """The head's share at `scored` tokens: `copies` (N, V) logits-sized tensors in the compute dtype, plus the
    loss's fp32 work on one block of rows."""
    return scored * copies * dtype_bytes * vocab + min(scored, rows_per_block(vocab)) * vocab * 4 * HEAD_BLOCK_COPIES


@dataclass(frozen=True)
class MicroBatch:
    """The largest micro-batch a run forms: `rows` episodes of `width` tokens, `shared` leading ones computed once."""

    rows: int
    width: int
    shared: int
    scored_per_row: int

    @property
    def tokens(self) -> int:  # through the decoder
        return self.rows * (self.width - self.shared) + self.shared

    @property
    def scored(self) -> int:  # through the head
        return self.rows * self.scored_per_row


def largest_micro_batch(cfg, *, budget: int, width: int, shared: int, shortest: int | None = None,
                        seats: int = 1) -> MicroBatch:
    """The largest pass trainer/micro_batches.py's chunking can form from a step's episodes: rows x w within
    `budget` (one row when an episode is longer), for any episode width w from `shortest` (the first prompt's
    length: a row holds at least that) to `width`, never more rows than a step has episodes (`seats` episodes a
    game under self-play). Shorter rows fill the budget closer than the longest ones do (4 rows of 1,024 tokens
    are a 4,096 budget, 3 of 1,071 are 3,213): the largest is the width whose pass computes the most tokens,
    then scores the most (a row scores its turns' responses, no more than its width less `shortest`). The
    shared prefix is computed once unless the forward cannot share it (dropout on, --grad-checkpointing, FSDP:
    HFCausalPolicy.forward)."""
    episodes = cfg.tasks_per_step * cfg.num_samples_per_task * seats
    sharing = cfg.disable_dropout and not getattr(cfg, "grad_checkpointing", False) and cfg.learner_parallel != "fsdp"
    per_row = cfg.max_turns * cfg.max_new_tokens
    low = max(shared + 1, min(shortest or width, width))

    def at(w: int) -> MicroBatch:  # a row of w tokens: its first prompt (`shortest` at least), then its turns
        rows = max(1, min(episodes, budget // w))
        scored = per_row if shortest is None else max(1, min(per_row, w - low))
        return MicroBatch(rows=rows, width=w, shared=min(shared, w - 1) if sharing and rows > 1 else 0,
                          scored_per_row=scored)

    return max((at(w) for w in range(low, width + 1)), key=lambda mb: (mb.tokens, mb.scored, mb.width))


def kv_bytes(config, *, slots: int, width: int, dtype_bytes: int) -> int:
    """policy/slot_cache.py's cache_bytes, from the config."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return 2 * config.num_hidden_layers * (slots + 1) * kv_heads * width * head_dim * dtype_bytes


def eval_opponent_config(cfg):
    """The model config of a model --eval-opponent (base: --model); None for self, random or an endpoint."""
    from nanorllm.policy.chat_endpoint import is_endpoint

    name = cfg.model if cfg.eval_opponent == "base" else cfg.eval_opponent
    return None if name in MODEL_FREE or is_endpoint(name) else model_config(name)


def plan_run(parts: RunParts, *, config=None, free: dict[str, int] | None = None, shm_free: int | None = None,
             tasks: TaskShape | None = None) -> MemoryPlan | None:
    """The plan of the run assembled as `parts` (its config, devices and LoRA spec, trainer/parts.py); None
    where the model's config cannot be read without loading it. `free` / `shm_free`: what the devices and
    /dev/shm have free (read here by default); `tasks`: what the plan reads of the run's tasks (measured
    from its loaded tasks by default, memory/tasks.py)."""
    from nanorllm.config.specs import sampling_params
    from nanorllm.rollout.engine import longest_episode

    cfg, devices, lora = parts.cfg, parts.devices, parts.lora
    config = config if config is not None else model_config(cfg.model)
    if config is None:
        return None
    total, trainable = parameter_counts(config, lora)
    learner_dev = devices.learner
    compute = compute_bytes(cfg.dtype, learner_dev)
    tokens = budget_tokens(cfg.micro_batch_tokens)
    # the longest first prompt the run accepts (rollout/prompt_budget.py): a longer one is refused or dropped
    context = getattr(config, "max_position_embeddings", None)
    seats = getattr(parts.env, "seats", 1)
    # the turns' responses and feedback (a game's seat is also shown the other seats' replies)
    room = longest_episode(0, sampling_params(cfg), cfg.max_turns, seats)
    limit = cfg.max_prompt_tokens or (context - room if context else None)
    tasks = task_shape(parts, prompt_limit=limit) if tasks is None else tasks
    if tasks is None:  # guesses: the tokenizer cannot be had without loading a model
        tasks = TaskShape(first=(cfg.max_prompt_tokens or FIRST_PROMPT_TOKENS) + 64, shared=0)
    first = min(tasks.first, limit or tasks.first)
    episode = first + room
    shared = tasks.shared
    if cfg.agent:  # an agent writes its own prompts: a row holds what the endpoint lets it (EpisodeSettings.max_row_tokens)
        from nanorllm.config.specs import agent_row_tokens

        bounds = [n for n in (agent_row_tokens(cfg), context) if n]
        episode, shared = (min(bounds) if bounds else episode), 0
    width = -(-episode // 64) * 64  # the KV cache's slot width
    if seats > 1:  # each seat is shown its own prompt (its player's rules): rows of a pass share no prefix
        shared = 0
    mb = largest_micro_batch(cfg, budget=tokens, width=episode, shared=shared, shortest=first,
                             seats=seats if getattr(cfg, "opponent", "self") == "self" else 1)
    acts = activation_bytes(config, mb.tokens, scored=mb.scored, dtype_bytes=compute,
                            checkpointing=getattr(cfg, "grad_checkpointing", False), lora=lora)
    rollout_rows = min(cfg.max_batch_episodes, cfg.tasks_per_step * cfg.num_samples_per_task) + 1
    # the learner decodes the held-out eval, every episode at once up to --max-batch-episodes (and --serial's rollouts)
    eval_episodes = (cfg.max_batch_episodes if tasks.eval_tasks is None else tasks.eval_tasks) * (cfg.eval_samples or 1)
    learner_rows = max(rollout_rows if cfg.serial else 0, min(cfg.max_batch_episodes, eval_episodes) + 1)
    # what a joining row prefills: a game's seat its whole history (it holds no KV slot while the others move,
    # rollout/games.py), any other row its first prompt past the shared prefix (later turns extend its own slot)
    rejoin = episode if seats > 1 else max(1, first - tasks.shared)
    learner = Process("learner", learner_dev, [
        *trained_parts(total, trainable, lora=lora is not None, dtype_bytes=compute),
        Part("activations", acts, f"{mb.rows} x {mb.width} tokens{f', {mb.shared} shared' if mb.shared else ''}"),
        Part("kv", kv_bytes(config, slots=learner_rows, width=width, dtype_bytes=compute),
             f"agent rows of up to {width} tokens (--max-prompt-tokens bounds them)" if cfg.agent else ""),
        Part("prefill", prefill_bytes(config, rows=learner_rows - 1, tokens=rejoin, dtype_bytes=compute),
             f"{learner_rows - 1} x {rejoin} tokens"),
        *process_overheads(learner_dev)])
    if cfg.kl_coef > 0 and lora is None:
        learner.parts.insert(3, Part("reference", total * compute))
    if getattr(cfg, "teacher", None) is not None and (teacher := teacher_bytes(cfg, mb, learner_dev)) is not None:
        learner.parts.insert(3, Part("teacher", teacher, f"{cfg.teacher}, no grad", device=cfg.teacher_device))
    processes = [learner]
    # the shared block: what the workers load (every parameter, or the adapters), in the replica dtype
    shm = 0
    if devices.workers:
        shared = (total if lora is None else trainable) * (compute if lora is None else 4)
        in_place = learner_dev == "cpu" and lora is None and compute == 4
        host_readers = any(not w.startswith("cuda") for w in devices.workers) or learner_dev == "cpu"
        if host_readers:
            shm = shared
            if not in_place:
                learner.parts.append(Part("shm block", shared, device="cpu"))  # host memory, whatever the learner's
    for i, dev in enumerate(devices.workers):
        replica = total * compute if lora is None else (total - trainable) * compute + trainable * 4
        processes.append(Process(f"worker {i}", dev, [
            Part("weights", replica),
            Part("kv", kv_bytes(config, slots=rollout_rows, width=width, dtype_bytes=compute)),
            Part("prefill", prefill_bytes(config, rows=rollout_rows - 1, tokens=rejoin, dtype_bytes=compute),
                 f"{rollout_rows - 1} x {rejoin} tokens"),
            *process_overheads(dev)]))
    for held in reward_source_models(parts.env_spec.reward_sources):
        if (rm := held_model_bytes(held)) is None:
            continue
        # one copy in each process that scores: every worker, and the learner when it rolls out or evaluates
        scorers = processes[1:] + ([learner] if cfg.serial or eval_episodes or not devices.workers else [])
        for proc in scorers:
            proc.parts.append(Part(held.label, rm, held.note, device=held.device))
    opponent = getattr(cfg, "opponent", "self")
    copies, what = (cfg.pool_size, f"pool: {cfg.pool_size} snapshots of {cfg.model}, frozen") if opponent == "pool" \
        else (1, f"{opponent}, frozen")
    opp = model_config(cfg.model if opponent == "pool" else opponent) if opponent not in MODEL_FREE else None
    if opp is not None:
        # a game's model --opponent (trainer/training_engine.py), or each snapshot of the pool
        # (rollout/opponent_pool.py): frozen weights and its own KV slots where rollouts run
        frozen = parameter_counts(opp, None)[0] * compute + kv_bytes(opp, slots=rollout_rows, width=width,
                                                                       dtype_bytes=compute)
        for proc in processes[1:] or [learner]:
            proc.parts.append(Part("opponent", frozen * copies, what))
    if getattr(parts.env, "seats", 1) > 1 and eval_episodes and (opp := eval_opponent_config(cfg)) is not None:
        # a game's model --eval-opponent (base: --model), frozen in the learner, which evaluates
        eval_rows = min(cfg.max_batch_episodes, eval_episodes) + 1
        learner.parts.append(Part("eval opponent", parameter_counts(opp, None)[0] * compute + kv_bytes(
            opp, slots=eval_rows, width=width, dtype_bytes=compute), f"{cfg.eval_opponent}, frozen"))
    host_source = "given"
    if free is None:
        free, host_source = read_free({"cpu"} | {p.device for p in processes})
    return MemoryPlan(processes=processes, shm_bytes=shm, shm_free=shm_free_bytes() if shm_free is None else shm_free,
                      free=dict(free), micro_batch_tokens=tokens, shrink=SHRINK_RUN, host_source=host_source)


def teacher_bytes(cfg, mb: MicroBatch, learner_device: str) -> int | None:
    """The --teacher's weights in --dtype plus its no-grad forward of the largest micro-batch (one layer's
    activations alive at a time; its logits at the scored tokens in --dtype, and the exact KL's fp32 blocks),
    from its config alone; None where that cannot be read."""
    config = model_config(cfg.teacher)
    if config is None:
        return None
    dtype_bytes = compute_bytes(cfg.dtype, cfg.teacher_device or learner_device)
    total, _ = parameter_counts(config, None)
    layer = layer_bytes(config, dtype_bytes)
    return int(total * dtype_bytes + mb.tokens * layer + head_bytes(config.vocab_size, mb.scored, dtype_bytes=dtype_bytes,
                                                                   copies=1))


def held_model_bytes(held: HeldModel) -> int | None:
    """A reward source's frozen model (rewards/sources.py HeldModel): its weights plus one batch's forward (no
    gradients: one layer's activations alive at a time, and the logits), from its config alone; None where that
    cannot be read."""
    from transformers import AutoModelForSequenceClassification

    config = model_config(held.path)
    if config is None:
        return None
    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(config)
    weights = sum(p.numel() for p in model.parameters()) * held.dtype_bytes
    return int(weights + held.batch_tokens * layer_bytes(config, held.dtype_bytes))


def process_overheads(device: str) -> list[Part]:
    """What any process holds besides its model parts: its runtime on the host, and on a CUDA device its context."""
    runtime = Part("runtime", RUNTIME_BYTES, device="cpu")
    return [runtime] if not device.startswith("cuda") else [runtime, Part("cuda context", CUDA_CONTEXT_BYTES)]
