"""JSONL prompt files: one JSON object per line, e.g. a verl or DAPO-Math-17k export.

The file is scanned once at construction: every line is parsed and checked (so a bad
line fails the run at start-up, naming the file and line, not hours later), and only the
byte offset of each record is kept; ``get(index)`` re-reads that one line. Blank lines
are skipped; line numbers in errors are 1-based lines of the file, and ``locate(index)``
names a record's line for the run's prompt check (``loongsage.data.prompt_check``), which
also renders every record through the chat template and measures it.
"""

from __future__ import annotations

import json
from pathlib import Path

from loongsage.plugin import Prompt

from loongsage_agents.datasets.params import FileDatasetParams
from loongsage_agents.datasets.records import DatasetRecordError, record_to_prompt


class JsonlDataset:
    """Prompts read from a JSONL file with configurable prompt and ground-truth fields."""

    format = "jsonl"

    def __init__(self, params: FileDatasetParams, seed: int = 0) -> None:
        self.params = params
        self.path = Path(params.path).expanduser()
        if not self.path.is_file():
            raise FileNotFoundError(f"dataset.path: JSONL file '{self.path}' does not exist")
        self._offsets: list[tuple[int, int]] = []  # (byte offset, 1-based line number)
        with self.path.open("rb") as f:
            offset, line_no = 0, 0
            for raw in f:
                line_no += 1
                if raw.strip():
                    self._parse(raw, line_no, len(self._offsets))
                    self._offsets.append((offset, line_no))
                    if params.limit and len(self._offsets) >= params.limit:
                        break
                offset += len(raw)
        if not self._offsets:
            raise DatasetRecordError(f"{self.path}: the file holds no records")

    def _parse(self, raw: bytes, line_no: int, index: int) -> Prompt:
        where = f"{self.path} line {line_no}"
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as err:
            raise DatasetRecordError(f"{where}: invalid JSON ({err.msg} at column {err.colno})") from None
        except UnicodeDecodeError as err:
            raise DatasetRecordError(f"{where}: invalid UTF-8 (byte 0x{raw[err.start]:02x} at column "
                                     f"{err.start + 1}: {err.reason})") from None
        return record_to_prompt(record, self.params, index, where, self.format)

    def __len__(self) -> int:
        return len(self._offsets)

    def locate(self, index: int) -> str:
        """Where record ``index`` is: ``file line N`` (for errors naming it)."""
        return f"{self.path} line {self._offsets[index][1]}"

    def get(self, index: int) -> Prompt:
        """The prompt of record ``index`` (0-based, blank lines not counted)."""
        if not 0 <= index < len(self._offsets):
            raise IndexError(f"{self.path}: record {index} out of range (0..{len(self) - 1})")
        offset, line_no = self._offsets[index]
        with self.path.open("rb") as f:
            f.seek(offset)
            return self._parse(f.readline(), line_no, index)
