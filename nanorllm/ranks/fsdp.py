"""FSDP: the learner's parameters, gradients and optimizer state sharded over its ranks
(`--learner-parallel fsdp`), for a model whose AdamW state does not fit one device.

With DDP every rank holds the whole model, its gradients and its AdamW state (four times the
weights in fp32). With FSDP2 (`fully_shard` on each decoder layer and on the root) a rank holds 1/N
of each; a layer's full parameters exist only while it runs (its forward and backward all-gather
them) and its gradients are reduce-scattered after every micro-batch, so they stay sharded too.

What stays as with DDP:
- rank 0 keeps its full, plain `policy.model`: what the workers read (its parameters may be views
  into their shared block), what evaluation samples with and what checkpoints save. It trains a
  sharded copy (`policy.train_module`); after every optimizer step all ranks gather the full
  parameters (`gather_weights`) and rank 0 copies them into `policy.model`, in place. Another node's
  leader (it runs workers too) does the same; every other rank shards its model itself.
- the optimizer object stays the same (its hooks with it): `shard` swaps its parameters for the
  shards and hands rank 0's full state to them.
- checkpoints hold the full, plain optimizer state_dict (`full_optimizer_state`, keyed by position
  as `optimizer.state_dict()` is), so a checkpoint resumes on any number of ranks, ddp or fsdp.

Every FSDP forward is a collective: ranks run the same number of micro-batches (trainer/update.py) and
never the shared-prompt-prefix forward, whose shapes depend on the data.
"""

import copy
import time

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict, set_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def shard(policy, optimizer: torch.optim.Optimizer, ranks) -> None:
    """Shard the model over the ranks and point `optimizer` at the shards, with rank 0's state."""
    model = policy.model
    order = _names(model, optimizer)
    state = optimizer.state_dict() if ranks.rank == 0 else None  # a resumed run's (plain, by position)
    if ranks.local_rank == 0:  # keeps the full model its workers read: trains a copy
        model = copy.deepcopy(model)
    mesh = init_device_mesh(torch.device(ranks.device).type, (ranks.world,))  # the ranks' device, not the default
    layers = set(getattr(model, "_no_split_modules", None) or ())  # the decoder layer classes
    for module in model.modules():
        if type(module).__name__ in layers:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    policy.train_module, policy.share_prefix = model, False
    shards = dict(model.named_parameters())
    it = iter(order)
    for group in optimizer.param_groups:
        group["params"] = [shards[next(it)] for _ in group["params"]]
    optimizer.state.clear()
    if ranks.broadcast(bool(state and state["state"])):  # a fresh optimizer has nothing to hand over
        named = _by_name(state, order) if ranks.rank == 0 else {}
        set_optimizer_state_dict(model, optimizer, named,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


@torch.no_grad()
def gather_weights(policy) -> float:
    """Every rank: all-gather the updated parameters; a rank with a full model copies them into it
    in place (its parameters may be the workers' shared block). Returns seconds taken."""
    t0 = time.perf_counter()
    full = dict(policy.model.named_parameters()) if policy.model is not policy.train_module else {}
    for name, p in policy.train_module.named_parameters():
        whole = p.full_tensor()
        if full:
            full[name].copy_(whole)
    return time.perf_counter() - t0


def full_optimizer_state(policy, optimizer: torch.optim.Optimizer, ranks) -> dict | None:
    """Every rank: gather the sharded optimizer state; rank 0 gets it as `optimizer.state_dict()`
    of the unsharded model would be (plain tensors keyed by position), the others None."""
    state = get_optimizer_state_dict(policy.train_module, optimizer,
                                     options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if ranks.rank:
        return None
    index = {name: i for i, name in enumerate(_names(policy.train_module, optimizer))}
    return {"state": dict(sorted((index[n], s) for n, s in state["state"].items())),
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]]}


def _names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of each of the optimizer's parameters, in its order (a state_dict's positions)."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    return [name_of[id(p)] for g in optimizer.param_groups for p in g["params"]]


def _by_name(state: dict, order: list[str]) -> dict:
    """A plain optimizer state_dict (keyed by position) keyed by parameter name, as torch's
    distributed state-dict functions take it."""
    return {"state": {order[i]: s for i, s in state["state"].items()},
            "param_groups": [{**g, "params": [order[i] for i in g["params"]]} for g in state["param_groups"]]}
