"""CUDA IPC transport for a receiver on the very GPU the sender's tensors live on.

The sender keeps `num_slots` bucket-sized GPU buffers for its lifetime and hands each
receiver their IPC handles once (torch's `reduce_tensor`, the mechanism behind SGLang's
`/update_weights_from_tensor` with serialized handles and baidu-baige/LoongSage's `_share_cuda_()`).
Per bucket only the metadata frame crosses the control socket; the receiver copies straight
out of the mapped buffer on the device and acks after its stream finished the copy.
Needs a CUDA machine; skipped elsewhere.
"""

from __future__ import annotations

from multiprocessing.connection import Connection

import torch
from torch.multiprocessing.reductions import reduce_tensor

from loongsage.transfer.channels import SlotReceiverChannel, SlotSenderChannel
from loongsage.transfer.frames import Ack, BucketMeta, TransferConfig
from loongsage.transfer.peer import Peer


def cuda_ipc_available() -> bool:
    return torch.cuda.is_available()


class CudaIpcSenderChannel(SlotSenderChannel):
    transport = "cuda_ipc"

    def __init__(self, config: TransferConfig, slots: list[torch.Tensor], sender_rank: int,
                 device: str):
        super().__init__(config, slots, sender_rank)
        on_device = bool(slots) and all(str(s.device) == device for s in slots)
        self.gpu_slots = slots if on_device else [
            torch.empty(config.bucket_bytes, dtype=torch.uint8, device=device)
            for _ in range(config.num_slots)]

    def channel_slots(self) -> list[torch.Tensor]:
        return self.gpu_slots

    def welcome(self, peer: Peer) -> dict:
        return {"handles": [reduce_tensor(slot) for slot in self.gpu_slots]}

    def publish(self, slot: torch.Tensor) -> None:
        torch.cuda.current_stream(slot.device).synchronize()


class CudaIpcReceiverChannel(SlotReceiverChannel):
    def __init__(self, setup: dict, conn: Connection, device: str, config_timeout_s: float):
        super().__init__(setup, conn, device, config_timeout_s)
        self.slots = [rebuild(*args) for rebuild, args in setup["handles"]]

    def release(self, meta: BucketMeta) -> None:
        torch.cuda.current_stream(self.slots[meta.slot].device).synchronize()
        self.conn.send(Ack(meta.version, meta.slot))
