"""Where every tensor that must move between host and device is, asserted through ``torch.device``.

``benchmarks/gpu_check.py``'s ``engines`` part offloads and onloads the embedded train and
rollout engines (``loongsage.engines.memory``). On a GPU it asserts after each move that every
parameter, gradient, optimizer state tensor and buffer is where the move put it: a tensor left
behind on the host is a "found at least two devices" error in the next step, and one left on
the device is memory the colocated engine never gets back.

On a CPU those moves are no-ops (there is nowhere to move to), so ``--cpu`` adds a dry run of
the same code on a second device that exists everywhere: ``meta`` (shapes and dtypes, no
storage). The engines' own ``onload()`` runs with their device set to ``meta``, and every
tensor must then be on ``torch.device("meta")``: a tensor the CUDA path would forget (say,
optimizer state or a buffer) stays on ``cpu`` and fails here. Only the host-to-device
direction can be rehearsed this way (a ``meta`` tensor has no bytes to copy back), and the
engines are unusable afterwards. A CPU tensor's data cannot be set to a ``meta`` one, so
``nn.Module.to`` would make new ``Parameter`` objects (untying tied weights, orphaning the
optimizer's keys), which a move to CUDA never does: the dry run turns on
``torch.__future__.set_swap_module_params_on_conversion`` for its moves, which keeps every
``Parameter`` object as the CUDA move does.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch


class DevicePlacementError(AssertionError):
    """Tensors that should have moved are elsewhere."""


def train_state_tensors(trainer: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters, gradients, buffers and optimizer state (tensors of one or more dimensions:
    Adam's ``step`` counters stay on the host) of an embedded train engine."""
    yield from module_tensors(trainer.model)
    for name, param in trainer.model.named_parameters():
        if param.grad is not None:
            yield f"{name}.grad", param.grad
    for index, state in enumerate(trainer.optimizer.state.values()):
        for key, value in state.items():
            if torch.is_tensor(value) and value.dim() > 0:
                yield f"optimizer.state[{index}].{key}", value


def module_tensors(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from module.named_parameters()
    yield from module.named_buffers()


def assert_on(named: Iterator[tuple[str, torch.Tensor]], device: str | torch.device,
              phase: str) -> int:
    """Raise naming every tensor not on ``torch.device(device)``; return how many were checked."""
    want = torch.device(device)
    if want.type == "cuda" and want.index is None:
        want = torch.device("cuda", torch.cuda.current_device())
    checked, wrong = 0, []
    for name, tensor in named:
        checked += 1
        if tensor.device != want:
            wrong.append(f"{name} on {tensor.device}")
    if not checked:
        raise DevicePlacementError(f"{phase}: no tensors to check")
    if wrong:
        shown = ", ".join(wrong[:8]) + (f" and {len(wrong) - 8} more" if len(wrong) > 8 else "")
        raise DevicePlacementError(f"{phase}: {len(wrong)} of {checked} tensors not on {want}: {shown}")
    return checked


def dry_run_onload(trainer: Any, engine: Any) -> dict[str, int]:
    """Both engines' ``onload()`` towards ``meta``; every tensor that must move is asserted on it.
    Leaves both engines unusable (their tensors have no storage)."""
    meta = torch.device("meta")
    swapping = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        trainer.device = meta
        if not trainer.onload():
            raise DevicePlacementError("train onload towards meta moved nothing")
        engine.device = meta
        if not engine.onload():
            raise DevicePlacementError("rollout onload towards meta moved nothing")
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swapping)
    return {"train_tensors_on_meta": assert_on(train_state_tensors(trainer), meta, "train onload (dry run)"),
            "rollout_tensors_on_meta": assert_on(module_tensors(engine.model), meta,
                                                 "rollout onload (dry run)")}
