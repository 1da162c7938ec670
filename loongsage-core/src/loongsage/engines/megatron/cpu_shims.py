"""What Megatron-Core 0.16.1 needs to run on a CPU with gloo, and nothing more.

Megatron-Core is written for CUDA. On a machine without a GPU (CI, laptops) three things
stand between its ``GPTModel`` and a forward/backward pass (docs/backends.md); each shim
below says which call site it answers. On a CUDA machine every function here returns
without touching anything, so GPU runs use Megatron exactly as shipped.

* ``torch.cuda.current_device`` is called at about 250 sites (rotary embeddings, buffers,
  ``device=torch.cuda.current_device()``); without CUDA it raises. ``install`` makes it
  answer ``"cpu"``.
* ``torch.cuda.synchronize`` is called by the pipeline schedules' point-to-point
  communication; on CPU there is nothing to wait for, so it becomes a no-op.
* The pipeline schedules allocate ``torch.zeros(..., device="cuda")`` (no flag avoids it),
  and ``GPTModel`` on a pipeline's last stage moves its tied output weight with
  ``weight.data.cuda()`` before syncing it with the first stage: ``cuda_factories_on_cpu``
  is a ``TorchFunctionMode`` that rewrites ``device="cuda"`` of tensor factory calls to the
  CPU and makes ``Tensor.cuda()`` the identity, for the duration of a schedule call or a
  model build.

One more is not about the CPU but about Transformer Engine being absent (always so on CPU,
rare on GPU clusters): ``moe_utils.router_gating_linear`` tests ``te_general_gemm is not
None``, a name 0.16.1 only defines when Transformer Engine imports; ``install`` defines it
as ``None`` when it is missing, so the MoE router falls back to ``torch.mm`` as intended.

Seeding goes through ``seed_model_parallel`` (``model_parallel_cuda_manual_seed`` with
``inference_rng_tracker=True``, which never creates a CUDA generator); dropout is 0 in our
configs, so the tracker's streams never draw.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch.overrides import TorchFunctionMode

_FACTORIES = frozenset({torch.zeros, torch.ones, torch.empty, torch.full, torch.tensor,
                        torch.arange, torch.randn, torch.rand, torch.zeros_like,
                        torch.ones_like, torch.empty_like})
_installed = False


def cpu_only() -> bool:
    """True when the shims are needed: no CUDA device is visible."""
    return not torch.cuda.is_available()


def install() -> None:
    """Patch ``torch.cuda.current_device`` and ``synchronize`` for CPU runs, and the missing
    ``te_general_gemm`` (idempotent)."""
    global _installed
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    if _installed or not cpu_only():
        return
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda device=None: None
    _installed = True


class _CudaFactoriesOnCpu(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func in _FACTORIES and str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


@contextlib.contextmanager
def cuda_factories_on_cpu() -> Iterator[None]:
    """Within the block, ``device="cuda"`` tensor factories allocate on the CPU and
    ``Tensor.cuda()`` stays put (CPU only)."""
    if not cpu_only():
        yield
        return
    with _CudaFactoriesOnCpu():
        yield


def seed_model_parallel(seed: int) -> None:
    """Seed Megatron's RNG tracker; on CPU without the CUDA generator it would create."""
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(seed, inference_rng_tracker=cpu_only())
