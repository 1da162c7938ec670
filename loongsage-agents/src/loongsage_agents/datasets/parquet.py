"""Parquet prompt files, e.g. ``dapo-math-17k.parquet`` or a verl-preprocessed GSM8K.

The needed columns are read once into an Arrow table (columnar, so a 1.8M-row file costs
far less memory than Python dicts) and nested struct columns are flattened into dotted
names, so ``reward_model.ground_truth`` addresses a struct field directly. Missing
columns fail at construction with the list of available ones; a null value fails with its
row number when that row is read.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from loongsage.plugin import Prompt

from loongsage_agents.datasets.params import FileDatasetParams
from loongsage_agents.datasets.records import DatasetRecordError, record_to_prompt


def _flatten(table: pa.Table) -> pa.Table:
    while any(pa.types.is_struct(f.type) for f in table.schema):
        table = table.flatten()
    return table


class ParquetDataset:
    """Prompts read from a Parquet file with configurable prompt and ground-truth fields."""

    format = "parquet"

    def __init__(self, params: FileDatasetParams, seed: int = 0) -> None:
        self.params = params
        self.path = Path(params.path).expanduser()
        if not self.path.is_file():
            raise FileNotFoundError(f"dataset.path: Parquet file '{self.path}' does not exist")
        wanted = [params.prompt_field, params.ground_truth_field, *params.metadata_fields]
        top = sorted({p.split(".")[0] for p in wanted})
        names = pq.read_schema(self.path).names
        table = pq.read_table(self.path, columns=[c for c in top if c in names])
        if params.limit:
            table = table.slice(0, params.limit)
        table = _flatten(table)
        self._columns: dict[str, pa.ChunkedArray] = {}
        for label, path in self._fields():
            matched = [c for c in table.column_names if c == path or c.startswith(path + ".")]
            if not matched:
                raise DatasetRecordError(
                    f"{self.path}: field '{path}' ({label}) is not a column; columns (nested "
                    f"fields dotted): {', '.join(sorted(set(names) | set(table.column_names)))}"
                )
            self._columns.update({c: table.column(c) for c in matched})
        if table.num_rows == 0:
            raise DatasetRecordError(f"{self.path}: the file holds no rows")
        self._rows = table.num_rows

    def _fields(self) -> list[tuple[str, str]]:
        p = self.params
        fields = [("dataset.prompt_field", p.prompt_field), ("dataset.ground_truth_field", p.ground_truth_field)]
        return fields + [("dataset.metadata_fields", m) for m in p.metadata_fields]

    def __len__(self) -> int:
        return self._rows

    def get(self, index: int) -> Prompt:
        """The prompt of row ``index`` (0-based)."""
        if not 0 <= index < self._rows:
            raise IndexError(f"{self.path}: row {index} out of range (0..{self._rows - 1})")
        record: dict = {}
        for path, column in self._columns.items():
            *parents, leaf = path.split(".")
            node = record
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = column[index].as_py()
        return record_to_prompt(record, self.params, index, f"{self.path} row {index}", self.format)
