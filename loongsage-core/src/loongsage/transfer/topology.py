"""Choosing a transport per receiver from where it runs relative to the sender.

Receivers report `ReceiverInfo(host, device)`; the sender knows its own host and the device its
tensors live on. The rules are an ordered table, first match wins, so adding a transport (say
RDMA) is one row, not another branch:

| transport | when |
|---|---|
| cuda_ipc | receiver on the sender's host and on the very GPU the sender's tensors are on |
| nccl | receiver on any other GPU |
| shm | receiver on the sender's host, on CPU |
| gloo | receiver on CPU on another host |

baidu-baige/LoongSage partitions the same way on (ip, gpu_id) but has no CPU paths.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from loongsage.transfer.frames import ReceiverInfo


@dataclass(frozen=True)
class SenderPlace:
    host: str
    device: str


def _is_cuda(device: str) -> bool:
    return device.startswith("cuda")


def _same_host(sender: SenderPlace, receiver: ReceiverInfo) -> bool:
    return sender.host == receiver.host


RULES: tuple[tuple[str, Callable[[SenderPlace, ReceiverInfo], bool]], ...] = (
    ("cuda_ipc", lambda s, r: _same_host(s, r) and _is_cuda(r.device) and r.device == s.device),
    ("nccl", lambda s, r: _is_cuda(r.device)),
    ("shm", lambda s, r: _same_host(s, r) and r.device == "cpu"),
    ("gloo", lambda s, r: r.device == "cpu"),
)


def choose_transport(sender: SenderPlace, receiver: ReceiverInfo) -> str:
    for name, matches in RULES:
        if matches(sender, receiver):
            return name
    raise ValueError(f"ReceiverInfo.device: expected 'cpu' or 'cuda[:N]', got {receiver.device!r} "
                     f"from receiver {receiver.receiver_id!r}")


def partition(sender: SenderPlace, receivers: Iterable[ReceiverInfo]) -> dict[str, list[str]]:
    """Receiver ids grouped by the transport each gets."""
    groups: dict[str, list[str]] = {}
    for info in receivers:
        groups.setdefault(choose_transport(sender, info), []).append(info.receiver_id)
    return groups
