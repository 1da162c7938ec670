"""One model's worth of device memory shared by several teachers of one architecture.

A ``WeightSlot`` owns the parameters of one built model as views into flat buffers (one per
dtype), and a preallocated host copy of every teacher that shares it (pinned on a GPU, so
copies run asynchronously; plain CPU memory otherwise). ``switch(i)`` makes teacher ``i``
resident by copying its host copy into the slot; the model's modules never change, only the
numbers in their parameters, so a forward after a switch is exactly that teacher's forward.

Prefetch (baidu-baige/LoongSage swaps synchronously): with a spare buffer of the same size,
``prefetch(i)`` starts copying teacher ``i`` into the spare on a background thread (on a GPU, on a
side CUDA stream) while the current teacher computes; the next ``switch(i)`` waits for what is left
of that copy and then re-points the parameters at the spare buffer, which becomes the active one.
The price is one more model-sized buffer in the slot. ``SwapStats`` records what a caller reports:
swaps, seconds blocked in ``switch`` and the copy intervals, from which the overlap with compute is
measured.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class SwapStats:
    """What switching cost: swaps made, seconds ``switch`` blocked, finished copy intervals."""

    swaps: int = 0
    swap_s: float = 0.0
    copies: list[tuple[float, float]] = field(default_factory=list)  # (start, end), perf_counter


def _flat_layout(params: list[nn.Parameter]) -> dict[torch.dtype, int]:
    sizes: dict[torch.dtype, int] = {}
    for p in params:
        sizes[p.dtype] = sizes.get(p.dtype, 0) + p.numel()
    return sizes


class WeightSlot:
    """The parameters of ``model`` backed by swappable flat buffers (module docstring)."""

    def __init__(self, model: nn.Module, teachers: int, prefetch: bool) -> None:
        self.params = list(dict(model.named_parameters()).values())  # tied weights appear once
        self.names = list(dict(model.named_parameters()))
        self.device = self.params[0].device
        self.sizes = _flat_layout(self.params)
        cuda = self.device.type == "cuda"
        self._buffers = [self._allocate(self.device)]
        self._point_at(self._buffers[0], copy_from_params=True)
        self.host: list[dict[torch.dtype, torch.Tensor]] = []
        if teachers > 1:
            whole = {dt: torch.empty(teachers, n, dtype=dt, pin_memory=cuda) for dt, n in self.sizes.items()}
            self.host = [{dt: whole[dt][i] for dt in whole} for i in range(teachers)]
        if prefetch and teachers > 1:
            self._buffers.append(self._allocate(self.device))
        self._stream = torch.cuda.Stream(self.device) if cuda else None
        self.resident = 0
        self.stats = SwapStats()
        self._staged: int | None = None
        self._copy: threading.Thread | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of one teacher's parameters (the slot's size)."""
        return sum(n * torch.empty(0, dtype=dt).element_size() for dt, n in self.sizes.items())

    def _allocate(self, device: torch.device) -> dict[torch.dtype, torch.Tensor]:
        return {dt: torch.empty(n, dtype=dt, device=device) for dt, n in self.sizes.items()}

    def _point_at(self, buffer: dict[torch.dtype, torch.Tensor], copy_from_params: bool = False) -> None:
        offsets = dict.fromkeys(buffer, 0)
        for p in self.params:
            start = offsets[p.dtype]
            view = buffer[p.dtype][start : start + p.numel()].view(p.shape)
            if copy_from_params:
                view.copy_(p.data)
            p.data = view
            offsets[p.dtype] = start + p.numel()

    def store(self, index: int, named: dict[str, torch.Tensor]) -> None:
        """Write teacher ``index``'s parameters (``named``: name -> tensor) into its host copy."""
        offsets = dict.fromkeys(self.sizes, 0)
        for name, p in zip(self.names, self.params):
            start = offsets[p.dtype]
            self.host[index][p.dtype][start : start + p.numel()].copy_(named[name].reshape(-1))
            offsets[p.dtype] = start + p.numel()

    def store_resident(self, index: int) -> None:
        """Copy the parameters the slot holds now into teacher ``index``'s host copy."""
        for dt, flat in self._buffers[0].items():
            self.host[index][dt].copy_(flat)

    def _copy_into(self, buffer: dict[torch.dtype, torch.Tensor], index: int) -> None:
        start = time.perf_counter()
        if self._stream is None:
            for dt, flat in buffer.items():
                flat.copy_(self.host[index][dt])
        else:
            with torch.cuda.stream(self._stream):
                for dt, flat in buffer.items():
                    flat.copy_(self.host[index][dt], non_blocking=True)
            self._stream.synchronize()
        self.stats.copies.append((start, time.perf_counter()))

    def prefetch(self, index: int) -> None:
        """Start copying teacher ``index`` into the spare buffer (no-op without one)."""
        if len(self._buffers) < 2 or index == self.resident or self._copy is not None:
            return
        self._staged = index
        self._copy = threading.Thread(target=self._copy_into, args=(self._buffers[1], index), daemon=True)
        self._copy.start()

    def switch(self, index: int) -> None:
        """Make teacher ``index`` resident: wait for its prefetch, or copy it in now."""
        if index == self.resident:
            return
        start = time.perf_counter()
        if self._copy is not None:
            self._copy.join()
            self._copy = None
        if self._staged == index:
            self._buffers.reverse()
            self._point_at(self._buffers[0])
        else:
            self._copy_into(self._buffers[0], index)
        self._staged = None
        self.resident = index
        self.stats.swaps += 1
        self.stats.swap_s += time.perf_counter() - start

    def take_stats(self) -> SwapStats:
        stats, self.stats = self.stats, SwapStats()
        return stats
