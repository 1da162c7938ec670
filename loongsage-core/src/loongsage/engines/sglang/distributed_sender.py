"""Sender side of SGLang's distributed weight update (remote GPU engines over NCCL).

SGLang servers receive weights through two HTTP calls plus collectives (SGLang's native API:
sgl-project/sglang `python/sglang/srt/entrypoints/http_server.py`): `/init_weights_update_group
{master_address, master_port, rank_offset, world_size, group_name, backend}` makes every server's TP
ranks join a process group with the trainer as rank 0; then, per bucket,
`/update_weights_from_distributed {names, dtypes, shapes, group_name, flush_cache,
abort_all_requests, weight_version, load_format}` makes each server post one broadcast per listed
tensor, in order, while the trainer broadcasts them. The HTTP call returns only after the server
received the bucket, so the sender posts from threads and broadcasts meanwhile. The group is built
exactly as SGLang's own `init_custom_process_group` (tcp:// rendezvous, `PrefixStore(group_name)`,
torch's `_new_process_group_helper`), the private torch API every peer (SGLang, slime, verl,
OpenRLHF) uses for a second world. We broadcast tensor by tensor because that request shape works on
every SGLang version; the flattened-bucket `load_format` of newer versions is not used (its value is
unverified).
"""

from __future__ import annotations

import datetime
import inspect
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx
import torch
import torch.distributed as dist

from loongsage.transfer.bucketing import dtype_name
from loongsage.transfer.frames import WeightSyncError


def join_group(*, master_address: str, master_port: int, rank: int, world_size: int,
               group_name: str, backend: str, timeout_s: float):
    """Join (or, as rank 0, host) a standalone process group the way SGLang does."""
    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        _world,
        rendezvous,
    )

    timeout = datetime.timedelta(seconds=timeout_s)
    store, rank, world_size = next(rendezvous(f"tcp://{master_address}:{master_port}", rank,
                                              world_size, timeout=timeout))
    store.set_timeout(timeout)
    params = inspect.signature(_new_process_group_helper).parameters
    options = "backend_options" if "backend_options" in params else "pg_options"
    group, _ = _new_process_group_helper(world_size, rank, [], Backend(backend),
                                         PrefixStore(group_name, store), group_name=group_name,
                                         timeout=timeout, **{options: None})
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def buckets_by_bytes(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
                     ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of whole tensors of at most `bucket_bytes` (a larger tensor alone)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def distributed_request(bucket: Sequence[tuple[str, torch.Tensor]], *, group_name: str,
                        version: int, flush_cache: bool) -> dict:
    """The `/update_weights_from_distributed` body for one bucket."""
    return {"names": [n for n, _ in bucket], "dtypes": [dtype_name(t.dtype) for _, t in bucket],
            "shapes": [list(t.shape) for _, t in bucket], "group_name": group_name,
            "flush_cache": flush_cache, "abort_all_requests": False,
            "weight_version": str(version), "load_format": None}


class SGLangDistributedSender:
    """Trainer rank 0 pushing weights to SGLang-compatible servers over a broadcast group."""

    def __init__(self, engine_urls: Sequence[str], *, master_address: str, master_port: int,
                 tp_sizes: Sequence[int] | None = None, group_name: str = "loongsage_weights",
                 backend: str = "nccl", bucket_bytes: int = 512 << 20, device: str = "cuda",
                 timeout_s: float = 600.0):
        self.urls = [u.rstrip("/") for u in engine_urls]
        self.tp_sizes = list(tp_sizes or [1] * len(self.urls))
        if len(self.tp_sizes) != len(self.urls):
            raise ValueError(f"tp_sizes: expected one per engine ({len(self.urls)}), got "
                             f"{len(self.tp_sizes)}")
        self.master_address, self.master_port = master_address, master_port
        self.group_name, self.backend, self.device = group_name, backend, device
        self.bucket_bytes, self.timeout_s = bucket_bytes, timeout_s
        self.world_size = 1 + sum(self.tp_sizes)
        self.group = None
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.urls)))
        self._http = httpx.Client(timeout=timeout_s)

    def _post_all(self, path: str, bodies: Sequence[dict]):
        return [self._pool.submit(self._post, url, path, body)
                for url, body in zip(self.urls, bodies)]

    def _post(self, url: str, path: str, body: dict) -> dict:
        response = self._http.post(f"{url}{path}", json=body)
        if response.status_code != 200:
            raise RuntimeError(f"{url}{path}: HTTP {response.status_code}: {response.text}")
        data = response.json()
        if isinstance(data, dict) and data.get("success") is False:
            raise RuntimeError(f"{url}{path}: {data.get('message', data)}")
        return data

    def init_group(self) -> None:
        offsets = [1 + sum(self.tp_sizes[:i]) for i in range(len(self.urls))]
        futures = self._post_all("/init_weights_update_group", [
            {"master_address": self.master_address, "master_port": self.master_port,
             "rank_offset": offset, "world_size": self.world_size,
             "group_name": self.group_name, "backend": self.backend} for offset in offsets])
        self.group = join_group(master_address=self.master_address,
                                master_port=self.master_port, rank=0,
                                world_size=self.world_size, group_name=self.group_name,
                                backend=self.backend, timeout_s=self.timeout_s)
        for future in futures:
            future.result()

    def sync(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """Send one version; returns the number of buckets. Errors name version and bucket."""
        if self.group is None:
            raise RuntimeError("SGLangDistributedSender.sync called before init_group()")
        buckets = buckets_by_bytes(named_tensors, self.bucket_bytes)
        index, bucket = 0, next(buckets, None)
        while bucket is not None:
            following = next(buckets, None)
            body = distributed_request(bucket, group_name=self.group_name, version=version,
                                       flush_cache=following is None)
            try:
                futures = self._post_all("/update_weights_from_distributed",
                                         [body] * len(self.urls))
                for _, tensor in bucket:
                    dist.broadcast(tensor.detach().to(self.device).contiguous(), src=0,
                                   group=self.group)
                for future in futures:
                    future.result()
            except (RuntimeError, httpx.HTTPError) as exc:
                raise WeightSyncError(version, index, str(exc)) from exc
            index, bucket = index + 1, following
        return index

    def close(self) -> None:
        if self.group is not None:
            for future in self._post_all("/destroy_weights_update_group",
                                         [{"group_name": self.group_name}] * len(self.urls)):
                future.exception()
            dist.destroy_process_group(self.group)
            self.group = None
        self._pool.shutdown(wait=False)
        self._http.close()
