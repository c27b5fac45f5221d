"""LoRA (policy/lora.py): only adapters train, the base stays bit-identical, the KL reference is the
same model with adapters off, the weight store carries adapters only and workers do not drift,
sampler == learner on every family, checkpoints resume exactly, final_model loads two ways, bad input
stops with exit 2."""

import gc
import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import nanorllm.envs.math_env as math_env
from families import FAMILIES, tiny_family_model
from nanorllm.config import TrainConfig
from nanorllm.pipeline.weights import SharedWeights
from nanorllm.policy.byte_tokenizer import tiny_tokenizer
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.config.specs import lora_spec
from nanorllm.policy.lora import (AdaptersOff, LoraError, LoraSpec, add_adapters, merged_state, target_names,
                                  trainable_parameters)
from nanorllm.run.lifecycle import main
from nanorllm.trainer.parity import check_logit_parity
from nanorllm.trainer.reference import reference_policy
from nanorllm.trainer.runlock import LOCK_NAME
from nanorllm.trainer.step import train_step
from nanorllm.trainer.update import make_optimizer
from tests.runs import SERIAL as BASE
from tests.runs import copy_run, length_rule
from tests.test_train_step import build_results

SPEC = LoraSpec(rank=4, alpha=8.0)


@pytest.fixture
def length_rule_grader(monkeypatch):
    monkeypatch.setattr(math_env, "judge", length_rule)


def lora_policy(dtype: str = "float32", *, replica: bool = False, spec: LoraSpec = SPEC) -> HFCausalPolicy:
    return HFCausalPolicy.from_name("tiny-random", dtype=dtype, replica=replica, lora=spec)


def adapters(policy) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainable_parameters(policy.model)}


def base(policy) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in policy.model.named_parameters() if not p.requires_grad}


def kick_adapters(policy, scale: float = 0.3, seed: int = 0) -> None:
    """Nonzero B matrices (peft starts them at 0, where the adapters compute nothing)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in trainable_parameters(policy.model):
            p.add_(torch.randn(p.shape, generator=g) * scale)


# ---- the learner -----------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_only_adapters_train_and_the_base_stays_bit_identical(dtype):
    policy = lora_policy(dtype)
    trained = trainable_parameters(policy.model)
    assert trained and all("lora_" in n for n, _ in trained)
    assert all(p.dtype == torch.float32 for _, p in trained)  # fp32 adapters over a base in --dtype
    frozen = base(policy)
    assert all(t.dtype == torch.float32 if dtype == "float32" else t.dtype == torch.bfloat16 for t in frozen.values())
    cfg = TrainConfig(model="tiny-random", lr=1e-2, temperature=1.0, micro_batch_tokens=128, lora_rank=4)
    optimizer = make_optimizer(policy, cfg)
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {id(p) for _, p in trained}
    before = adapters(policy)
    results = build_results(policy)
    for _ in range(3):
        m = train_step(policy, optimizer, results, cfg)
        assert m["grad_norm"] > 0
    after = base(policy)
    assert after.keys() == frozen.keys() and all(torch.equal(frozen[k], after[k]) for k in frozen)
    now = adapters(policy)
    assert all(not torch.equal(before[k], now[k]) for k in before)


@pytest.mark.parametrize("family", FAMILIES)
def test_default_targets_are_every_attention_and_mlp_projection(family):
    assert target_names(tiny_family_model(family, tiny_tokenizer()), "attn-mlp") == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    c = lora_policy().peft.peft_config["default"]
    assert c.r == 4 and c.lora_alpha == 8 and set(c.target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj",
                                                                          "gate_proj", "up_proj", "down_proj"}
    assert lora_spec(TrainConfig(lora_rank=16)).alpha == 32  # alpha defaults to 2 x rank
    assert lora_spec(TrainConfig()) is None  # rank 0: a full fine-tune


# ---- the KL reference ------------------------------------------------------------------------------------
def base_copies(like: torch.Tensor) -> set[int]:
    """Storages of every live tensor shaped like `like` (the base's embedding)."""
    gc.collect()
    with warnings.catch_warnings():  # isinstance on every live object touches deprecated torch attributes
        warnings.simplefilter("ignore")
        return {t.untyped_storage().data_ptr() for t in gc.get_objects()
                if isinstance(t, torch.Tensor) and t.shape == like.shape and t.dtype == like.dtype}


def test_the_kl_reference_is_the_base_function_with_no_second_copy_of_the_base():
    policy = lora_policy()
    kick_adapters(policy)
    embed = policy.model.get_input_embeddings().weight
    before = base_copies(embed)  # other tests' models may be alive too: only what the reference adds counts
    ref = reference_policy(policy, TrainConfig(model="tiny-random", kl_coef=0.1, lora_rank=4), "cpu", "tiny-random")
    assert isinstance(ref, AdaptersOff)
    assert base_copies(embed) == before and embed.untyped_storage().data_ptr() in before  # no second copy
    plain = HFCausalPolicy.from_name("tiny-random")  # the initial model, loaded on its own
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    mask, positions = torch.ones_like(ids), torch.tensor([[0, 2], [0, 4]])
    with torch.no_grad():
        want = plain.forward(ids, mask, positions).logits
        got = ref.forward(ids, mask, positions).logits
        adapted = policy.forward(ids, mask, positions).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert float((adapted - want).abs().max()) > 1e-3  # the adapters are back on after the reference forward


# ---- the weight store and the workers --------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_after_100_publishes_a_worker_computes_the_learners_merged_weights(dtype):
    learner = lora_policy(dtype)
    store = SharedWeights(learner.model, None, params=trainable_parameters(learner.model))
    n_adapter = sum(p.numel() for _, p in trainable_parameters(learner.model))
    assert store.nbytes == 4 * n_adapter < sum(p.numel() for p in learner.model.parameters())
    worker = lora_policy(dtype, replica=True)
    pristine = base(worker)
    block = store.attach(worker.model, params=trainable_parameters(worker.model))
    g = torch.Generator().manual_seed(1)
    for version in range(1, 101):
        store.begin_write()
        with torch.no_grad():
            for _, p in trainable_parameters(learner.model):
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
        store.publish(version)
        assert store.load_into(block)[0] == version
    assert all(torch.equal(pristine[k], v) for k, v in base(worker).items())  # its base never touched: no drift
    want, got = merged_state(learner.model), merged_state(worker.model)
    assert want.keys() == got.keys() and "model.layers.0.self_attn.q_proj.weight" in want
    moved = 0
    for k in want:
        w, x = want[k].float(), got[k].float()
        ulp = torch.finfo(want[k].dtype).eps * w.abs().clamp_min(torch.finfo(want[k].dtype).tiny)
        assert bool(((w - x).abs() <= ulp).all()), k  # within one rounding of the replica dtype
        moved += int(not torch.equal(w, pristine.get(k.replace(".weight", ".base_layer.weight"), w).float()))
    assert moved == 14  # every adapted projection (7 per layer, 2 layers) really changed


# ---- sampler == learner ----------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_startup_parity_holds_with_adapters_on_every_family(family):
    tokenizer = tiny_tokenizer()
    model = tiny_family_model(family, tokenizer)
    peft_model = add_adapters(model, SPEC, base_name="tiny")
    policy = HFCausalPolicy(model, tokenizer)
    policy.peft = peft_model
    kick_adapters(policy, scale=1.0)
    ids, positions = torch.tensor([[5, 6, 7, 8, 9, 10]]), torch.tensor([[0, 3], [0, 5]])
    with torch.no_grad():
        on = policy.forward(ids, torch.ones_like(ids), positions).logits
        with peft_model.disable_adapter():
            off = policy.forward(ids, torch.ones_like(ids), positions).logits
    assert float((on - off).abs().max()) > 0.1  # the adapters change the function the check compares
    r = check_logit_parity(policy, temperature=0.7)
    assert r["gap_max"] < 1e-2


# ---- bad input -------------------------------------------------------------------------------------------
def test_bad_lora_settings_are_refused_naming_the_field():
    problems = TrainConfig(lora_rank=-1, lora_alpha=0.0, lora_dropout=1.0).validate()
    assert any(p.startswith("lora_rank: must be >= 0") for p in problems)
    assert any(p.startswith("lora_alpha:") for p in problems) and any(p.startswith("lora_dropout:") for p in problems)
    assert any(p.startswith("learner_parallel: 'fsdp' is not supported with LoRA")
               for p in TrainConfig(lora_rank=4, learner_parallel="fsdp").validate())
    assert not TrainConfig(lora_rank=4).validate()


def test_targets_that_match_nothing_list_the_models_linear_layers():
    model = tiny_family_model("llama", tiny_tokenizer())
    with pytest.raises(LoraError, match="qkv_proj match.*no linear layer of LlamaForCausalLM.*down_proj, gate_proj"):
        add_adapters(model, LoraSpec(rank=4, alpha=8, targets="q_proj,qkv_proj"), base_name="x")
    assert target_names(model, "q_proj, v_proj") == ["q_proj", "v_proj"]
    assert "lm_head" not in target_names(model, "all-linear")


def test_a_model_peft_cannot_wrap_is_refused_naming_its_class():
    class NoLinear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(2, 2, 1)

    with pytest.raises(LoraError, match="no linear layer of NoLinear"):
        add_adapters(NoLinear(), SPEC, base_name="x")


def test_bad_lora_flags_exit_2_before_a_model_loads(capsys):
    assert main(["--model", "no/such-model", "--lora-rank", "-2"]) == 2
    err = capsys.readouterr().err
    assert "lora_rank: must be >= 0" in err


def test_targets_that_match_nothing_stop_the_run_with_exit_2_and_nothing_written(tmp_path, capsys):
    assert main([*BASE, "--output-dir", str(tmp_path), "--run-name", "t", "--lora-rank", "4",
                 "--lora-targets", "c_attn"]) == 2
    err = capsys.readouterr().err
    assert "c_attn match" in err and "q_proj" in err and "LlamaForCausalLM" in err
    run = tmp_path / "t"  # the memory plan refuses them before the run folder exists; at most its lock is there
    assert not run.exists() or {p.name for p in run.iterdir()} <= {LOCK_NAME}


@pytest.mark.slow
def test_resume_refuses_to_change_between_full_fine_tuning_and_lora_or_the_adapters_shape(
        serial_runs, lora_runs, tmp_path, capsys):
    """Copies of the shared 2-step runs: full fine-tuning, and LoRA rank 4."""
    (tmp_path / "full").mkdir()
    full = copy_run(Path(serial_runs["part"]), tmp_path / "full")
    lora = copy_run(Path(lora_runs["part"]), tmp_path)
    cases = [(full, ["--lora-rank", "4"], "lora_rank: 4 given, the checkpoint was trained with 0"),
             (lora, ["--lora-rank", "0"], "lora_rank: 0 given, the checkpoint was trained with 4"),
             (lora, ["--lora-rank", "8"], "lora_rank: 8 given"),
             (lora, ["--lora-targets", "q_proj"], "lora_targets: 'q_proj' given")]
    for run, flags, line in cases:
        before = sorted(p.name for p in run.rglob("*"))
        assert main(["--resume", str(run), "--max-steps", "2", *flags]) == 2
        err = capsys.readouterr().err
        assert line in err and "cannot change on resume" in err
        assert sorted(p.name for p in run.rglob("*")) == before  # nothing written


# ---- checkpoints, resume, final model --------------------------------------------------------------------
@pytest.mark.slow
def test_lora_checkpoints_hold_adapters_and_optimizer_state_and_resume_exactly(lora_runs, tmp_path,
                                                                              length_rule_grader):
    """The shared LoRA runs (rank 4, a KL term, the TIS correction, lr 1e-2): a copy of the 2-step one
    resumed to step 4 ends with the 4-step one's adapters."""
    whole = Path(lora_runs["whole"])
    part = copy_run(Path(lora_runs["part"]), tmp_path)
    assert main(["--resume", str(part), "--max-steps", "4"]) == 0
    ckpt = part / "checkpoints" / "step_4"
    assert {p.name for p in (ckpt / "model").iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}
    assert not (ckpt / "model" / "model.safetensors").exists()  # the adapter, not the model
    files = json.loads((ckpt / "manifest.json").read_text())["files"]
    assert "model/adapter_model.safetensors" in files and "optimizer.pt" in files
    opt = torch.load(ckpt / "optimizer.pt", weights_only=True)
    n_adapters = len(load_file(str(ckpt / "model" / "adapter_model.safetensors")))
    assert len(opt["state"]) == n_adapters and all(s["step"] == 4 for s in opt["state"].values())
    a = load_file(str(whole / "final_model" / "adapter_model.safetensors"))
    b = load_file(str(part / "final_model" / "adapter_model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6)
    assert any(float(v.abs().max()) > 0 for k, v in b.items() if "lora_B" in k)  # it trained


@pytest.mark.slow
def test_final_model_is_a_peft_adapter_and_a_merged_model_and_eval_takes_either(lora_runs):
    """The shared 2-step LoRA run (rank 4, lr 1e-2), read only."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from nanorllm.policy.models import load_model_and_tokenizer
    from nanorllm.trainer.eval_model import EvalConfig, evaluate_model

    run = Path(lora_runs["part"])
    # the start-of-run line: what trains of what the model holds
    trained = sum(p.numel() for _, p in trainable_parameters(lora_policy().model))
    total = sum(p.numel() for p in lora_policy().model.parameters())
    assert f"[model] LlamaForCausalLM: {trained:,} of {total:,} parameters train" in lora_runs["part_output"]
    final = run / "final_model"
    config = json.loads((final / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "tiny-random" and config["r"] == 4
    base_model, _ = load_model_and_tokenizer("tiny-random")
    adapted = PeftModel.from_pretrained(base_model, str(final)).eval()
    merged = AutoModelForCausalLM.from_pretrained(final / "merged").eval()  # transformers alone
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
    with torch.no_grad():
        want = adapted(input_ids=ids).logits
        got = merged(input_ids=ids).logits
        plain = load_model_and_tokenizer("tiny-random")[0](input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert float((want - plain).abs().max()) > 1e-4  # the adapter is in there
    for model in (str(final), str(final / "merged")):
        res = evaluate_model(EvalConfig(tasks="arith:max=20,terms=2,ops=+-,count=3,seed=2", model=model,
                                        max_new_tokens=4))
        assert res["n"] == 3


# ---- learner ranks ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_ddp_ranks_train_the_same_adapters_as_one_rank(tiny_policy):
    """DDP over a LoRA model holds only the adapters' gradients (the base requires none): the 2-rank step
    equals the 1-rank step on the same batch, and what moved is the adapters."""
    from nanorllm.bench.learner_ranks import steps_on_ranks
    from tests.test_train_step import config

    results = build_results(tiny_policy)
    cfg = config(lora_rank=4, disable_dropout=False)
    initial = torch.cat([p.detach().flatten() for _, p in trainable_parameters(lora_policy().model)])
    one = steps_on_ranks(1, [(cfg, results)])[0]["params"]
    two = steps_on_ranks(2, [(cfg, results)])[0]["params"]
    assert one.shape == two.shape == initial.shape  # the adapters, nothing else
    assert float((one - two).abs().max()) <= 1e-5
    assert float((one - initial).abs().max()) > 1e-3


@pytest.mark.parametrize("preset, lora_gb, full_gb", [("qwen2.5-0.5b", 1.2, 7.5), ("qwen2.5-1.5b", 3.4, 24.0)])
def test_the_qwen_presets_take_adapters_and_their_lora_state_fits_where_full_fine_tuning_does_not(
        preset, lora_gb, full_gb):
    """Built on the meta device (shapes, no weights): the bf16 base plus fp32 adapters with their gradients and
    AdamW moments, against 16 bytes a parameter for a full fine-tune (the 1.5B one does not fit a 24 GB box)."""
    from nanorllm.policy.lora import parameter_counts
    from nanorllm.policy.presets import PRESETS

    cls, config_cls, shape = PRESETS[preset]
    with torch.device("meta"):
        model = cls(config_cls(**shape)).to(torch.bfloat16)
    add_adapters(model, LoraSpec(rank=16, alpha=32), base_name=f"preset:{preset}")
    trained, total = parameter_counts(model)
    assert {p.dtype for _, p in trainable_parameters(model)} == {torch.float32}
    lora_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) + 3 * 4 * trained
    assert lora_bytes / 1e9 < lora_gb and 16 * (total - trained) / 1e9 > full_gb
