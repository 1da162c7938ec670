"""LoRA on the embedded train engine (``train.lora``, through ``peft``), and the adapter sync.

The adapters are injected into the HF model in place (``peft.inject_adapter_in_model``), so
the engine keeps one plain ``*ForCausalLM`` whose targeted ``nn.Linear`` layers gain
``lora_A``/``lora_B``; every other parameter is frozen and only the adapters reach the
optimizer. The reference policy is the same model with the adapters switched off
(:meth:`LoraAdapters.disabled`): no second copy of the weights.

Weight sync (``train.lora.sync``):

* ``merged``: the HF state dict with ``W + (alpha / rank)·B·A`` in place of every adapted
  weight, under the base names: any engine (SGLang too) takes it like full weights.
* ``adapter``: only the adapters, as ``<module>.lora_A`` ``[rank, in]``, ``<module>.lora_B``
  ``[out, rank]`` and ``<module>.lora_scaling`` (``alpha / rank``, one float64). The embedded
  rollout engine merges them on receipt into its base weights (:func:`merge_adapters`);
  peers fall back to full or on-disk weights for LoRA (slime, verl), SGLang's own LoRA path
  loads adapters from disk. Bytes per sync: the adapters' size (+ 8 per module, one 64-byte
  aligned slot each in TransferMesh's buckets), not the model's.

Both merges compute the delta as peft's ``merge_and_unload`` does, ``(B·A)·scaling`` in fp32
then added to the weight (:func:`lora_delta`), so the weights an engine holds after an adapter
sync are bit for bit peft's merge of the same adapter. The scaling used to be folded into
``B`` before the product, ``(scaling·B)·A``: unless the scaling is a power of two that
rounds differently, about one ulp of the weight in some entries, which moved SmolLM2's
log-probs by 1.1e-5 against the same engine loaded with peft's merge (docs/algorithms.md).

Checkpoints hold the adapter in peft's format (``adapter_model.safetensors`` +
``adapter_config.json``, loadable by ``peft`` and by transformers' PEFT integration on the
base model) beside ``train_state.pt``. Deviation: ``dropout`` acts only in ``train_step``'s
forwards; the pi_old and reference forwards run without it, so the first mini-batch's ratio is
not exactly 1 when ``dropout > 0`` (as in TRL and peft-based trainers).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import torch
from torch import nn

from loongsage.errors import ConfigError, LoongSageError
from loongsage.install_hints import extra_command
from loongsage.schema import LoraSettings

ADAPTER_FILE = "adapter_model.safetensors"
SYNC_MODES = ("adapter", "merged")
A_SUFFIX, B_SUFFIX, SCALE_SUFFIX = ".lora_A", ".lora_B", ".lora_scaling"
SUFFIXES = (A_SUFFIX, B_SUFFIX, SCALE_SUFFIX)


def lora_delta(a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """``(B·A)·scaling`` in fp32, in peft's order (``LoraLayer.get_delta_weight``)."""
    return (b.float() @ a.float()) * scaling


def check_lora(settings: LoraSettings) -> None:
    """Refuse impossible ``train.lora`` values, naming the key."""
    checks = {
        "train.lora.rank": (settings.rank >= 0, f"must be >= 0 (0 = off), got {settings.rank}"),
        "train.lora.alpha": (settings.alpha > 0, f"must be > 0, got {settings.alpha}"),
        "train.lora.dropout": (0 <= settings.dropout < 1, f"must be in [0, 1), got {settings.dropout}"),
        "train.lora.target_modules": (bool(settings.target_modules), "needs at least one module name"),
        "train.lora.sync": (settings.sync in SYNC_MODES, f"expected one of {list(SYNC_MODES)}, got {settings.sync!r}"),
    }
    for key, (ok, problem) in checks.items():
        if not ok:
            raise ConfigError(key, problem)


class LoraAdapters:
    """The adapters injected into ``model``; see the module docstring."""

    def __init__(self, model: nn.Module, settings: LoraSettings, base_path: str) -> None:
        check_lora(settings)
        try:
            from peft import LoraConfig, inject_adapter_in_model
            from peft.tuners.tuners_utils import BaseTunerLayer
        except ImportError:
            raise ConfigError("train.lora", f"needs peft: {extra_command('loongsage-core', 'lora')}") from None
        self.settings = settings
        self.config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                                 target_modules=list(settings.target_modules),
                                 base_model_name_or_path=base_path)
        try:
            inject_adapter_in_model(self.config, model)
        except ValueError as err:  # no module matched
            raise ConfigError("train.lora.target_modules", str(err)) from None
        self.model = model
        self.layers = {name: m for name, m in model.named_modules() if isinstance(m, BaseTunerLayer)}
        for name, param in model.named_parameters():
            param.requires_grad_(".lora_" in name)

    # forwards -------------------------------------------------------------------------
    @contextmanager
    def disabled(self) -> Iterator[None]:
        """The base model: every adapter off (the reference policy)."""
        for layer in self.layers.values():
            layer.enable_adapters(False)
        try:
            yield
        finally:
            for layer in self.layers.values():
                layer.enable_adapters(True)

    @contextmanager
    def dropout_active(self) -> Iterator[None]:
        """The adapters' dropout on (``train_step``'s forwards only)."""
        drops = [m for layer in self.layers.values() for m in layer.lora_dropout.values()]
        for m in drops:
            m.train()
        try:
            yield
        finally:
            for m in drops:
                m.eval()

    # weights out ------------------------------------------------------------------------
    def _adapter(self, layer: Any) -> tuple[torch.Tensor, torch.Tensor, float]:
        """``(A [rank, in], B [out, rank], scaling)`` of ``layer``'s one adapter."""
        name = layer.active_adapters[0]
        return layer.lora_A[name].weight.detach(), layer.lora_B[name].weight.detach(), float(layer.scaling[name])

    def sync_tensors(self, named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """What an engine receives per ``train.lora.sync``; ``named`` is the model's state dict."""
        if self.settings.sync == "adapter":
            for module, layer in self.layers.items():
                a, b, scaling = self._adapter(layer)
                yield f"{module}{A_SUFFIX}", a
                yield f"{module}{B_SUFFIX}", b
                yield f"{module}{SCALE_SUFFIX}", torch.tensor([scaling], dtype=torch.float64)
            return
        for name, tensor in named:
            if ".lora_" in name:
                continue
            hf_name = name.replace(".base_layer.", ".")
            module = hf_name.rsplit(".", 1)[0]
            if hf_name.endswith(".weight") and module in self.layers:
                tensor = tensor + lora_delta(*self._adapter(self.layers[module])).to(tensor.dtype)
            yield hf_name, tensor

    # checkpoints ------------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        state = {f"base_model.model.{k}": v.detach().cpu().contiguous()
                 for k, v in get_peft_model_state_dict(self.model).items()}
        save_file(state, str(folder / ADAPTER_FILE))
        self.config.save_pretrained(str(folder))

    def load(self, folder: Path) -> None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        path = folder / ADAPTER_FILE
        if not path.is_file():
            raise LoongSageError(f"{folder}: train.lora is on but the checkpoint has no {ADAPTER_FILE}")
        saved = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
        if saved.get("r") != self.settings.rank or sorted(saved.get("target_modules") or []) != \
                sorted(self.settings.target_modules):
            raise LoongSageError(f"{folder}: its adapter (rank {saved.get('r')}, modules "
                                 f"{saved.get('target_modules')}) does not match train.lora")
        state = {k.removeprefix("base_model.model."): v for k, v in load_file(str(path)).items()}
        result = set_peft_model_state_dict(self.model, state)
        if getattr(result, "unexpected_keys", None):
            raise LoongSageError(f"{folder}: unexpected adapter tensors {result.unexpected_keys[:5]}")


def merge_adapters(params: Mapping[str, torch.Tensor], bases: dict[str, torch.Tensor],
                   items: list[tuple[str, torch.Tensor]]) -> tuple[list[tuple[str, torch.Tensor]],
                                                                   list[tuple[str, torch.Tensor]]]:
    """Split ``items`` into plain tensors and merged adapter weights for a receiving engine.

    Adapters (``<module>.lora_A``, ``<module>.lora_B``, ``<module>.lora_scaling``) become
    ``(<module>.weight, base + (B·A)·scaling)`` (:func:`lora_delta`), where ``base`` is the
    weight the engine held before the first adapter arrived (kept in ``bases``), so every sync
    merges the whole current adapter into the same base. Returns ``(plain, merged)``; raises
    ``ValueError`` naming an adapter with a part missing or a shape that does not fit.
    """
    parts: dict[str, dict[str, torch.Tensor]] = {}
    plain = []
    for name, tensor in items:
        for suffix in SUFFIXES:
            if name.endswith(suffix):
                parts.setdefault(name[: -len(suffix)], {})[suffix] = tensor
                break
        else:
            plain.append((name, tensor))
    merged = []
    for module, adapter in parts.items():
        target = params.get(f"{module}.weight")
        if len(adapter) != len(SUFFIXES) or target is None:
            raise ValueError(f"apply_weights: adapter of '{module}' needs {', '.join(module + s for s in SUFFIXES)} "
                             f"of a '{module}.weight' this model has; got {sorted(adapter)}")
        a, b, scaling = adapter[A_SUFFIX], adapter[B_SUFFIX], adapter[SCALE_SUFFIX]
        if a.dim() != 2 or b.dim() != 2 or (b.shape[0], a.shape[1]) != tuple(target.shape) or b.shape[1] != a.shape[0]:
            raise ValueError(f"apply_weights: adapter of '{module}' has A {tuple(a.shape)}, B "
                             f"{tuple(b.shape)}; the weight is {tuple(target.shape)}")
        if scaling.numel() != 1:
            raise ValueError(f"apply_weights: {module}{SCALE_SUFFIX} must hold one number, got shape "
                             f"{tuple(scaling.shape)}")
        if module not in bases:
            bases[module] = target.detach().clone()
        base = bases[module]
        delta = lora_delta(a.to(base.device), b.to(base.device), float(scaling.reshape(())))
        merged.append((f"{module}.weight", base + delta.to(base.dtype)))
    return plain, merged
