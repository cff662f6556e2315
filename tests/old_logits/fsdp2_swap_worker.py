"""The per-process body of ``test_swap_fsdp2.py`` (a module of its own: spawned processes import
it by name, which the test module, loaded with --import-mode=importlib, cannot offer)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

WORLD = 2


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(6, 8)  # a root-level parameter, as embeddings are in verl
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = torch.tanh(block(h))
        return self.head(h)


def _perturb(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            local.add_(torch.randn(local.shape, generator=g).to(local.device) * 0.5)


PROVIDERS = ("snapshot", "ewma")


def run(rank: int, device_type: str, port: int) -> None:
    """One rank: for each provider, FSDP2 over a tiny net, a no-grad forward, one under
    swapped-in weights, one after the restore; each must equal an unsharded forward with the
    weights it should have used."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo" if device_type == "cpu" else "nccl", rank=rank, world_size=WORLD)
    try:
        if device_type == "cuda":
            torch.cuda.set_device(rank)
        device = torch.device(device_type, rank if device_type == "cuda" else 0)
        for provider in PROVIDERS:
            _check(provider, device, rank)
        dist.barrier()  # neither rank tears gloo down while the other still uses it
    finally:
        dist.destroy_process_group()


def _check(provider: str, device: torch.device, rank: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from verl_ext.old_logits import OldLogitsConfig, OldLogitWorkerState

    mesh = init_device_mesh(device.type, (WORLD,))
    torch.manual_seed(0)
    model = Net().to(device)
    reference = Net().to(device)  # unsharded, loaded with full weights for the expected outputs
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1)).to(device)

    config = OldLogitsConfig.from_config({"provider": provider, "ewma": {"beta": 0.0}}, max_off_policy_threshold=2)
    state = OldLogitWorkerState(config, list(model.parameters()), modules=[model])
    # A fake optimizer step of version 0: the snapshot keeps the weights before it; the EWMA
    # (beta 0) takes the weights after it, and a second change then moves the live weights on.
    state.before_optimizer_step(0)
    _perturb(model, seed=10 + rank)
    state.after_optimizer_step()
    if provider == "ewma":
        _perturb(model, seed=20 + rank)
    swapped_spec = "snapshot:0" if provider == "snapshot" else "ewma"
    with torch.no_grad():
        swapped_expected = _full_forward(reference, model, x, swapped_spec, state)
        live_expected = _full_forward(reference, model, x, "current", state)
        first = model(x)  # leaves every module gathered (reshard_after_forward=False)
        with state.weights(swapped_spec):
            swapped = model(x)
        restored = model(x)
    torch.testing.assert_close(first, live_expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(swapped, swapped_expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(restored, live_expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(swapped, restored), provider


def _full_forward(reference, model, x, spec, state) -> torch.Tensor:
    """``reference`` (unsharded) loaded with the full weights ``spec`` names, applied to ``x``."""
    with state.weights(spec):
        full = {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()
                for name, p in model.named_parameters()}
    reference.load_state_dict(full)
    return reference(x)
