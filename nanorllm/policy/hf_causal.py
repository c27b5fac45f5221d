"""HFCausalPolicy: a local transformers causal LM as a policy.

Why our own sampling loop instead of `model.generate`: we need, for every sampled token, its
log-probability under exactly the distribution the learner will score (logits / temperature, full
vocabulary), and `generate` would have to keep (B, T, V) logits around to give us that. The loop is
a KV-cached decode in which a finished row leaves the batch at once and new rows can join between
steps; `generate` is one such batch, the RolloutEngine keeps one running across turns. That batch is
a SlotBatch (policy/slot_batch.py) over a preallocated slot KV cache the policy keeps between calls
(its decode step is replayed from CUDA graphs on a GPU). The DecodeBatch it grew from is the
reference it is tested against (bench/decode_batch.py).

Mixed precision: `dtype="bfloat16"` keeps the parameters in fp32 (the optimizer's master weights
and its state stay fp32, so a 6e-6 step is not rounded away below half a bf16 ulp) and runs every
forward under bf16 autocast; the learner's update reads bf16 copies of the Linear weights made once per update
(trainer/held_weights.py). A sampling-only `replica` (a pipeline worker) stores bf16 itself.

The stop set is the tokenizer's eos, the generation config's eos and the chat template's end-of-turn
token (`<|eot_id|>`, `<end_of_turn>`...), which for many models is not the eos.

Prompts are token streams, not re-rendered text: turn k+1's prompt is turn k's prompt + the sampled
response ids + the tokens of the new user message. Every later prompt therefore extends the earlier
one token for token, the learner can score all turns of an episode in one sequence, and no
decode/re-encode round trip can change a token the policy sampled.
"""

import contextlib
import inspect
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.utils import logging as hf_logging

from nanorllm.policy.base import Generation, Policy, SamplingParams
from nanorllm.policy import chat_render
from nanorllm.policy.decode_graphs import DecodeGraphs
from nanorllm.policy.lora import LoraSpec, add_adapters, load_adapter_weights, save_adapter
from nanorllm.policy.models import load_model_and_tokenizer
from nanorllm.policy.sampler import sample_with_uniforms, uniforms_from_generators
from nanorllm.policy.shared_columns import shared_columns_of
from nanorllm.policy.slot_batch import SlotBatch
from nanorllm.policy.slot_cache import SlotCache, SlotForward, check_fits, model_shape
from nanorllm.utils.precision import resolve as resolve_precision

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


hf_logging.disable_progress_bar()


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # (N, V) logits only at the N positions the batch asks for (none asked: (B, T, V), all)


class HFCausalPolicy(Policy):

    def __init__(self, model, tokenizer, *, device: str = "cpu", seed: int = 0,
                 compute_dtype: torch.dtype | None = None):
        self.model = model.to(device)
        self.train_module = self.model  # what the learner's forward calls: the model, its DDP wrapper or its FSDP shards
        self.share_prefix = True  # the shared-prompt-prefix forward (off under FSDP: its shapes depend on the data)
        self.grad_checkpointing = False  # set by enable_grad_checkpointing
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.version = 0
        # autocast dtype over the stored parameters; None computes in the parameters' own dtype
        self.compute_dtype = compute_dtype if compute_dtype != next(model.parameters()).dtype else None
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.pad_id = tokenizer.pad_token_id
        eos = model.generation_config.eos_token_id if model.generation_config else None
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_ids = sorted({tokenizer.eos_token_id, *eos, *chat_render.end_of_turn_ids(tokenizer)} - {None})
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        # transformers renamed `past_key_values` to `cache`; the cache object is updated in place.
        self._cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.slot_cache: SlotCache | None = None  # the decode engine's KV cache, kept between calls
        self.graphs_enabled = True  # on CUDA, replay decode steps from CUDA graphs (TrainConfig.cuda_graphs)
        self.decode_graphs: DecodeGraphs | None = None  # built on the first CUDA decode batch
        # a learner forward with no shared prefix passes its causal masks built (`full_masks`): transformers'
        # own check whether it may skip them reads the device. Off on CPU, where there is no device to wait
        # for and an unpadded batch keeps the kernel transformers picks for it.
        self.prebuilt_masks = self.device.type == "cuda"
        self.peft = None  # with LoRA: the PeftModel around `model` (policy/lora.py); `model` holds its layers
        # the update reads compute-dtype copies of the Linear weights, cast once per update (trainer/held_weights.py)
        self.hold_weights = True
        self.held = None  # those copies, made at the first update that holds

    @classmethod
    def from_name(cls, name: str, *, device: str = "cpu", dtype: str = "float32", seed: int = 0,
                  replica: bool = False, lora: LoraSpec | None = None, adapter: str | None = None):
        """`dtype` is the compute dtype ("auto": bf16 where `device` has bf16 units, utils/precision.py). The
        parameters are fp32 unless `replica` (sampling only). With `lora` the base is stored in the compute dtype
        and frozen, and fp32 adapters are added (their weights read from `adapter`, a peft adapter folder, when
        given)."""
        compute = DTYPES[resolve_precision(dtype, device)]
        stored = compute if replica or lora else torch.float32
        model, tokenizer = load_model_and_tokenizer(name, dtype=stored, device=device)
        if lora is None:
            model.replica_dtype = compute  # what a sampling replica stores (SharedWeights' buffer dtype)
            return cls(model, tokenizer, device=device, seed=seed, compute_dtype=compute)
        peft_model = add_adapters(model, lora, base_name=name, seed=seed)
        if adapter is not None:
            load_adapter_weights(peft_model, adapter)
        policy = cls(model, tokenizer, device=device, seed=seed, compute_dtype=compute)
        policy.peft = peft_model
        return policy

    def autocast(self):
        """The context every forward runs in: bf16 autocast over fp32 parameters, or nothing."""
        if self.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def forward_dtype(self) -> torch.dtype:
        """The dtype every forward computes in: the autocast dtype, else the stored weights' (a replica's, a LoRA
        base's)."""
        return self.compute_dtype or next(self.model.parameters()).dtype

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    # ---- prompts as token streams ----------------------------------------------------------
    def first_prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        return chat_render.prompt_ids(self.tokenizer, messages, tools)

    def next_prompt_ids(self, prompt_ids: list[int], response_ids: list[int], new_messages: dict | list[dict],
                        tools: list[dict] | None = None) -> list[int]:
        """The last prompt + response + the new messages (policy/chat_render.py continuation_ids)."""
        new = [new_messages] if isinstance(new_messages, dict) else list(new_messages)
        return chat_render.continuation_ids(self.tokenizer, self.eos_ids, prompt_ids, response_ids, new, tools)

    # ---- sampling --------------------------------------------------------------------------
    def row_generators(self, n: int) -> list[torch.Generator]:
        """One random stream per row, seeded from the policy's stream: row i samples the same
        tokens whatever else shares its batch (the engine draws one per episode, in order)."""
        seeds = torch.randint(0, 2**62, (n,), generator=self.generator, device=self.device).tolist()
        return [torch.Generator().manual_seed(s) for s in seeds]

    @contextlib.contextmanager
    def decode_batch(self, params: SamplingParams, *, keep_state: bool = True, stats: dict | None = None,
                     slots: int = 8, width: int = 256):
        """A SlotBatch to join rows into and step, over a cache of at least `slots` slots x `width`
        tokens (it grows if rows need more), in eval mode, no grad and the policy's autocast."""
        was_training = self.model.training
        self.model.eval()
        batch = None
        try:
            with torch.no_grad(), self.autocast():
                cache = self.ensure_slot_cache(slots, width)
                graphs = self.device.type == "cuda" and self.graphs_enabled
                if graphs and self.decode_graphs is None:
                    self.decode_graphs = DecodeGraphs()
                batch = SlotBatch(self, params, cache=cache, keep_state=keep_state, stats=stats,
                                  graphs=self.decode_graphs if graphs else None)
                yield batch
        finally:
            if batch is not None:
                batch.close()
            self.model.train(was_training)

    def ensure_slot_cache(self, slots: int, width: int) -> SlotCache:
        """The slot KV cache, (re)allocated when it has fewer slots or columns than asked; a cache that
        cannot fit the device's free memory is refused (CacheTooLarge names the flag to change)."""
        cache = self.slot_cache
        if cache is None or cache.slots < slots or cache.width < width:
            slots = max(slots, cache.slots if cache else 0)
            width = max(width, cache.width if cache else 0)
            dtype = self.forward_dtype()
            self.slot_cache = cache = None  # let the old buffers go before the new ones are counted
            if self.device.type == "cuda":
                torch.cuda.empty_cache()  # and back to the device: cached blocks count as used in mem_get_info
            nbytes = check_fits(self.model, slots=slots, width=width, dtype=dtype, device=self.device)
            layers, kv_heads, head_dim = model_shape(self.model)
            cache = SlotCache(layers, kv_heads, head_dim, slots=slots, width=width, dtype=dtype, device=self.device)
            self.slot_cache = cache
            if slots * width >= 4096:  # the sizes a run asks for, not a test's or a probe's
                print(f"[engine] slot KV cache: {slots} slots x {width} tokens x {layers} layers, "
                      f"{nbytes / 2**20:.0f} MiB ({str(dtype).removeprefix('torch.')}) on {self.device}", flush=True)
        return cache

    def capture_decode_graphs(self, params: SamplingParams, *, slots: int, width: int, on_progress=None) -> float:
        """Allocate the slot cache (its size printed; refused if it cannot fit) and capture every
        (slot-range, context) bucket's decode graph now (before a worker says it is ready), so no rollout pays for
        it; seconds taken (0.0 where there is nothing to capture: CPU, graphs off)."""
        self.ensure_slot_cache(slots, width)
        if self.device.type != "cuda" or not self.graphs_enabled:
            return 0.0
        with self.decode_batch(params, slots=slots, width=width) as batch:
            self.decode_graphs.on_progress = on_progress or (lambda: None)
            return self.decode_graphs.capture_all(batch)

    def slot_forward(self, input_ids: torch.Tensor, fwd: SlotForward, cache: SlotCache) -> torch.Tensor:
        """(B, V) logits after the last column of `input_ids` (B, T), the tokens written into `cache`
        where `fwd` says (policy/slot_cache.py)."""
        with cache.attending(self.model, fwd):
            out = self.model(input_ids=input_ids, position_ids=fwd.positions, use_cache=False, logits_to_keep=1)
        return out.logits[:, -1]

    def generate(self, conversations: list[list[dict]], prompt_ids: list[list[int]],
                 params: SamplingParams) -> list[Generation]:
        out, rngs = {}, self.row_generators(len(prompt_ids))
        width = max(map(len, prompt_ids)) + params.max_new_tokens + 1
        with self.decode_batch(params, keep_state=False, slots=len(prompt_ids), width=width) as batch:
            batch.join([(i, p, rng, None) for i, (p, rng) in enumerate(zip(prompt_ids, rngs))])
            while len(batch):
                out.update((key, gen) for key, gen, _ in batch.step())
        return [out[i] for i in range(len(prompt_ids))]

    def sample(self, logits: torch.Tensor, params: SamplingParams,
               rngs: list[torch.Generator | None]) -> tuple[torch.Tensor, torch.Tensor]:
        """Next token and its logprob under softmax(logits / temperature) over the full vocabulary.
        logits (B, V); row b draws its one uniform number from rngs[b] (inverse-CDF sampling)."""
        u = None if params.greedy else uniforms_from_generators(rngs, logits.device)
        return sample_with_uniforms(logits, params, u)

    # ---- scoring for the learner -------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor | None = None,
                shared: int | None = None, position_ids: torch.Tensor | None = None) -> ForwardOutput:
        """The model's own logits, only where a token is scored.

        input_ids, attention_mask: (B, T), right-padded; positions: (N, 2) rows of (b, t) whose
        logits predict token t + 1; returns (N, V) logits in the order of `positions`. Without `positions`, every
        position's: (B, T, V), as a plain causal LM forward returns them (`compute_policy_loss` takes either; the
        learner gives positions, so the head runs on the scored tokens alone).

        The head runs on those N rows only, never on (B, T): a pre-hook on the model's output
        embedding hands it the N rows of the final hidden states, (1, N, H), gathered with indices
        computed on the device from `positions`; the model then applies whatever follows its head
        (Gemma2's soft-capping, Granite's logits_scaling, Cohere's logit_scale) to them, as it would to
        all. Nothing is read back to the host, and it needs nothing of the transformers version
        (`logits_to_keep` masks are recent); the startup parity check holds it to the sampler.

        The leading tokens every row shares (the prompt template: chat markup, system prompt, worked
        example) are computed once and their keys/values expanded to every row; gradients flow back
        through that one copy. Not while the model trains in train mode: rows must not share dropout.
        `shared` is their count (collate_train_batch counts it on the host); without it, it is counted
        from the tensors, which reads them. Without a shared prefix the causal masks come prebuilt on
        CUDA (`full_masks`), so that forward reads nothing back either.

        Packed rows (collate_train_batch's `pack`): one row (1, L) of several sequences end to end, with
        `position_ids` (1, L) restarting at 0 at each; the masks are built from them so that attention
        never crosses a sequence's bounds (`full_masks`), and no prefix is shared.
        """
        if positions is None:  # every (b, t), row-major
            B, T = input_ids.shape
            every = torch.arange(B * T, device=input_ids.device)
            return ForwardOutput(self.forward(input_ids, attention_mask, torch.stack([every // T, every % T], 1),
                                              0, position_ids).logits.view(B, T, -1))
        P = 0
        if position_ids is None and self.share_prefix and not self.train_module.training:
            P = shared if shared is not None else shared_columns_of(input_ids, attention_mask, positions)
        kwargs = {"attention_mask": attention_mask}
        with self.autocast():
            if P:
                past = DynamicCache()
                base = getattr(self.model, self.model.base_model_prefix)  # the decoder alone: no head for the prefix
                base(input_ids=input_ids[:1, :P], use_cache=True, **{self._cache_kw: past})
                B = input_ids.shape[0]
                kwargs[self._cache_kw] = DynamicCache(ddp_cache_data=[
                    (layer.keys.expand(B, -1, -1, -1), layer.values.expand(B, -1, -1, -1)) for layer in past.layers])
                kwargs["position_ids"] = torch.arange(P, input_ids.shape[1], device=input_ids.device)[None].expand(B, -1)
                kwargs["use_cache"] = True
            else:
                kwargs["use_cache"] = False
                if position_ids is not None:
                    kwargs["position_ids"] = position_ids
                # a training forward over padded rows passes its masks built, additive in the query's dtype: given a
                # boolean mask SDPA makes that additive copy at every layer and saves each for the backward, a
                # (B, 1, T, T) a layer; given it additive, every layer saves the one mask
                training = torch.is_grad_enabled()
                if self.prebuilt_masks or position_ids is not None or (training and not bool(attention_mask.all())):
                    masks = full_masks(self.model, attention_mask, position_ids)
                    kwargs["attention_mask"] = additive(masks, self.forward_dtype()) if training else masks
            ids = input_ids[:, P:]
            rows = positions[:, 0] * ids.shape[1] + (positions[:, 1] - P)  # (N,) rows of the flat (B * (T - P)) states
            net = self._trained_model()
            hook = net.get_output_embeddings().register_forward_pre_hook(
                lambda _, args: (args[0].flatten(0, 1).index_select(0, rows)[None], *args[1:]))
            try:
                with self._checkpointed_layers():
                    logits = self.train_module(input_ids=ids, logits_to_keep=0, **kwargs).logits  # (1, N, V)
            finally:
                hook.remove()
        if logits.shape[:2] != (1, rows.shape[0]):  # shapes are host metadata: no device read
            raise RuntimeError(f"{type(net).__name__}: its head did not run on the gathered rows (logits of shape "
                               f"{tuple(logits.shape)} for {rows.shape[0]} positions); HFCausalPolicy.forward "
                               "gathers them in a forward pre-hook on get_output_embeddings()")
        return ForwardOutput(logits=logits[0])

    def enable_grad_checkpointing(self) -> None:
        """Activation checkpointing through transformers' own (non-reentrant): each decoder layer keeps its
        input only and is recomputed in the backward. Two things transformers does not do for us:
        it checkpoints a layer only while `layer.training` is true, and the learner's forward runs in eval
        mode (--disable-dropout), so `forward` marks the decoder layers alone as training (their dropouts
        and attention stay in eval mode: the same function); and it drops a KV cache handed to a
        checkpointed layer, so the shared-prompt-prefix forward (which hands the prefix's keys and values
        to every layer) is off: each row computes its prefix, which the checkpointing recomputes too."""
        kwargs = {"use_reentrant": False}
        if hasattr(self.model, "activation_checkpointing_enable"):  # transformers 5.x's name; the old one warns
            self.model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        self.grad_checkpointing, self.share_prefix = True, False

    @contextlib.contextmanager
    def _checkpointed_layers(self):
        """While the forward runs: the decoder layers (only them) in training mode, so transformers checkpoints them."""
        if not self.grad_checkpointing:
            yield
            return
        from transformers.modeling_layers import GradientCheckpointingLayer

        layers = [m for m in self._trained_model().modules() if isinstance(m, GradientCheckpointingLayer)]
        was = [m.training for m in layers]
        for m in layers:
            m.training = True
        try:
            yield
        finally:
            for m, w in zip(layers, was):
                m.training = w

    def _trained_model(self) -> torch.nn.Module:
        """The model the learner's forward runs: this one, the one inside its DDP wrapper, or its FSDP
        shards (a copy of its own)."""
        net = self.train_module
        return net.module if isinstance(net, torch.nn.parallel.DistributedDataParallel) else net

    def parameters(self):
        return self.model.parameters()

    def save(self, path: str) -> None:
        """The model in HF format; with LoRA the adapter alone, in peft's format (adapter_config.json,
        adapter_model.safetensors: `PeftModel.from_pretrained(base, path)` loads it)."""
        if self.peft is not None:
            save_adapter(self.peft, path)
        else:
            self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)


def full_masks(model, attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None
               ) -> torch.Tensor | dict | None:
    """The causal masks transformers builds for a forward over (B, T) rows with no cache, built without
    its check whether SDPA's `is_causal` could stand in for them: `masking_utils._ignore_causal_mask_sdpa`
    evaluates `fast_all(padding_mask)` as a Python bool, one device read per forward. A prebuilt 4-D
    mask is used as it is; a model with sliding-window layers takes one per layer type (its
    `causal_mask_mapping`). Where its layers are of other types, or its attention takes no 4-D mask
    (flash attention), or its transformers builds masks with other arguments (before 5.0: a
    `cache_position`, no `allow_is_causal_skip`), the (B, T) mask is returned for transformers to handle.

    With `position_ids` (packed rows, each sequence restarting at 0) a token attends only within its
    own sequence: the causal masks intersected with "same sequence", the sequences numbered on the
    device by counting the zeros of `position_ids`. Where transformers must build the masks, None: it finds
    the packed sequences from `position_ids` itself (reading the device once)."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    config = model.config
    types = set(getattr(config, "layer_types", None) or ["full_attention"])
    names = list(inspect.signature(create_causal_mask).parameters)
    if (config._attn_implementation not in ("sdpa", "eager") or not types <= {"full_attention", "sliding_attention"}
            or names[3:4] not in (["past_key_values"], ["cache"]) or "allow_is_causal_skip" not in names):
        return attention_mask if position_ids is None else None
    B, T = attention_mask.shape
    if position_ids is not None:  # a packed row's tail pads are one-token sequences: no query row attends to nothing
        attention_mask = torch.ones_like(attention_mask)
    embeds = torch.empty((B, T, 0), dtype=next(model.parameters()).dtype, device=attention_mask.device)  # shapes only
    args = (config, embeds, attention_mask, None)  # the 4th, no cache, is named past_key_values or cache by version
    masks = {"full_attention": create_causal_mask(*args, allow_is_causal_skip=False)}
    if "sliding_attention" in types:
        masks["sliding_attention"] = create_sliding_window_causal_mask(*args, allow_is_causal_skip=False)
    if position_ids is not None:
        sequence = (position_ids == 0).cumsum(-1)  # (B, T) which packed sequence each column belongs to
        same = sequence[:, None, :, None] == sequence[:, None, None, :]  # (B, 1, T, T)
        masks = {k: within(m, same) for k, m in masks.items()}
    return masks["full_attention"] if types == {"full_attention"} else masks


def additive(masks, dtype: torch.dtype):
    """full_masks' boolean 4-D masks as SDPA itself would make them additive: 0 where a token attends, -inf where
    not, in the query's `dtype` (the same values, so the same attention); anything else as it is."""
    if isinstance(masks, dict):
        return {k: additive(m, dtype) for k, m in masks.items()}
    if not isinstance(masks, torch.Tensor) or masks.dtype != torch.bool or masks.dim() != 4:
        return masks
    return torch.zeros(masks.shape, dtype=dtype, device=masks.device).masked_fill_(~masks, float("-inf"))


def within(mask: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """A prebuilt attention mask (boolean: True attends; or additive floats: 0 attends) restricted to `allowed`."""
    if mask.dtype == torch.bool:
        return mask & allowed
    return mask.masked_fill(~allowed, torch.finfo(mask.dtype).min)
