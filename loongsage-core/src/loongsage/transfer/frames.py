"""Wire records of TransferMesh: configuration, metadata frames and control messages.

A weight version travels as a stream of *frames*. A bucket frame describes one contiguous byte
buffer (the payload) and the tensor pieces inside it; an end frame closes the version with the
totals a receiver checks before it applies anything; an abort frame tells receivers that the
sender gave up. Control messages (hello, begin, result, ...) travel on a small authenticated
socket between each sender rank and each receiver; they are pickled, so the mesh assumes the
trust domain of the training cluster (as torch.distributed and Ray do).

Everything here is plain data, torch-free, so it can be imported and pickled anywhere.
"""

from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass, field

from loongsage.errors import LoongSageError

FRAME_BUCKET = "bucket"
FRAME_END = "end"
FRAME_ABORT = "abort"

ENCODING_DENSE = "dense"
ENCODING_SPARSE32 = "sparse_i32"
ENCODING_SPARSE64 = "sparse_i64"


class WeightSyncError(LoongSageError):
    """A weight version could not be delivered; names the version, the bucket and the cause."""

    def __init__(self, version: int, bucket: int | None, problem: str):
        self.version, self.bucket, self.problem = version, bucket, problem
        where = f" at bucket {bucket}" if bucket is not None else ""
        super().__init__(f"weight version {version} failed{where}: {problem}")


@dataclass
class TransferConfig:
    """How a TransferMesh packs and moves weights.

    bucket_bytes: size of one contiguous bucket (and of each warm shared-memory slot).
    num_slots: buckets in flight at once (2 = the sender packs one while receivers read the other).
    checksum: attach a CRC32 of every bucket payload; receivers reject a mismatching bucket.
    delta: keep a shadow of the last synced weights and send only changed elements to receivers
        that hold that version (costs one model-sized copy on the sender).
    host: address the control socket and process-group stores bind to and advertise.
    timeout_s: how long any side waits for a peer before declaring the version failed.
    """

    bucket_bytes: int = 64 << 20
    num_slots: int = 2
    checksum: bool = False
    delta: bool = False
    host: str = "127.0.0.1"
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.bucket_bytes < 4096:
            raise ValueError(f"transfer.bucket_bytes: expected >= 4096, got {self.bucket_bytes}")
        if self.num_slots < 1:
            raise ValueError(f"transfer.num_slots: expected >= 1, got {self.num_slots}")
        if self.timeout_s <= 0:
            raise ValueError(f"transfer.timeout_s: expected > 0, got {self.timeout_s}")


@dataclass(frozen=True)
class MeshAddress:
    """Where receivers reach one sender rank: control socket plus its shared secret."""

    host: str
    port: int
    sender_rank: int
    authkey: bytes = field(default_factory=lambda: secrets.token_bytes(16), repr=False)


@dataclass(frozen=True)
class TensorSpec:
    """One piece of one wire item inside a bucket.

    An item is a named tensor's bytes (encoding dense) or its sparse delta (int32 or int64
    indices, by encoding, followed by values; `count` of each). Items larger than the room left
    in a bucket are split: this piece covers bytes [item_offset, item_offset + nbytes) of an item of item_nbytes bytes and sits at
    byte `offset` of the bucket payload.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    encoding: str
    item_nbytes: int
    item_offset: int
    offset: int
    nbytes: int
    count: int = 0


@dataclass(frozen=True)
class BucketMeta:
    """The metadata frame sent ahead of each payload."""

    kind: str
    version: int
    sender_rank: int
    index: int
    specs: tuple[TensorSpec, ...] = ()
    nbytes: int = 0
    slot: int = 0
    checksum: int | None = None
    base_version: int | None = None
    num_buckets: int = 0
    total_bytes: int = 0
    reason: str = ""


@dataclass(frozen=True)
class ReceiverInfo:
    """What a receiver reports about itself so the mesh can pick its transport."""

    receiver_id: str
    host: str
    device: str = "cpu"
    address: str = "127.0.0.1"


@dataclass(frozen=True)
class Hello:
    info: ReceiverInfo
    applied_version: int | None
    mirror_version: int | None


@dataclass(frozen=True)
class Welcome:
    transport: str
    setup: dict


@dataclass(frozen=True)
class GroupSetup:
    generation: int
    host: str
    port: int
    rank: int
    world_size: int


@dataclass(frozen=True)
class Begin:
    """Opens a version. ``padded_bytes``: the payload with every tensor padded to ``ALIGN``,
    when the sender knows it up front (a full version given as a sequence), so a zero-copy
    receiver knows before the first bucket whether the version fits its ring."""

    version: int
    base_version: int | None
    padded_bytes: int | None = None


@dataclass(frozen=True)
class Frame:
    meta: BucketMeta


@dataclass(frozen=True)
class Ack:
    version: int
    slot: int


@dataclass(frozen=True)
class Result:
    version: int
    ok: bool
    applied_version: int | None
    mirror_version: int | None
    error: str = ""


@dataclass
class SyncReport:
    """What one `TransferMesh.sync` did, per receiver."""

    version: int
    base_version: int | None
    num_buckets: int
    payload_bytes: int
    tensor_bytes: int
    seconds: float
    transports: dict[str, list[str]]
    applied: list[str]
    failed: dict[str, str]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
