"""Fixture ``wandb_log``: read the records of a W&B ``.wandb`` transaction log (what an offline run writes).

The file is W&B's LevelDB-style log: a 7-byte header (``:W&B``, magic 0xBEE1, version 0), then
32 KiB blocks of chunks, each with a 7-byte header (crc32, length, type FULL/FIRST/MIDDLE/LAST).
wandb >= 0.2x ships no Python reader of it any more, so this test helper splits the chunks and
decodes every record with wandb's own protobuf ``Record`` type.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<HB", data[4:7]) == (0xBEE1, 0), data[:7]
    pos, parts, out = HEADER, [], []
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0:  # zero padding up to the block end
            pos += left
            continue
        payload, pos = data[pos + HEADER:pos + HEADER + length], pos + HEADER + length
        parts = [payload] if kind in (FULL, FIRST) else [*parts, payload]
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            out.append(record)
    return out


def finished(path: Path, timeout: float = 60.0) -> list:
    """The records once the run's ``exit`` record is on disk: ``run.finish()`` returns before
    wandb-core has flushed the offline log (measured: up to about a second later)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        found = records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in found) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def history(path: Path) -> list[dict]:
    """Every history row: ``{key: value}`` with W&B's ``_step``, ``_runtime``, ... included."""
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            for r in finished(path) if r.WhichOneof("record_type") == "history"]


def config(path: Path) -> dict:
    """The run's config as the last config record (or the run record) set it."""
    out: dict = {}
    for record in finished(path):
        kind = record.WhichOneof("record_type")
        items = record.config.update if kind == "config" else record.run.config.update if kind == "run" else []
        for item in items:
            out[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return out


@pytest.fixture
def wandb_log() -> SimpleNamespace:
    return SimpleNamespace(records=records, finished=finished, history=history, config=config)
