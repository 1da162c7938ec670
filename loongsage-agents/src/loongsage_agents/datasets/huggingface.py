"""Prompts through the Hugging Face ``datasets`` library (extra ``loongsage-agents[huggingface]``).

``path`` is a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (read
with ``load_from_disk``), or anything ``load_dataset`` takes: a builder for local files
(``json``, ``parquet``, ``csv``, ``text`` with ``data_files``) or a hub dataset id, which
resolves offline from the local cache when ``HF_HUB_OFFLINE=1`` (no dataset is downloaded on a
machine without a hub). Rows become prompts with the same dotted fields as the JSONL and
Parquet formats (``records.record_to_prompt``); the fields are checked against the columns and
the first row at construction, so a wrong field fails the run at start-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loongsage.plugin import Prompt, extra_command

from loongsage_agents.datasets.params import HuggingFaceDatasetParams
from loongsage_agents.datasets.records import DatasetRecordError, record_to_prompt

SAVED_MARKERS = ("dataset_info.json", "dataset_dict.json", "state.json")


def load_rows(params: HuggingFaceDatasetParams) -> Any:
    """The selected split as a ``datasets.Dataset``."""
    try:
        import datasets
    except ImportError:
        raise ValueError("the huggingface dataset format needs the 'datasets' package: "
                         f"{extra_command('loongsage-agents', 'huggingface')}") from None
    folder = Path(params.path).expanduser()
    if any((folder / marker).is_file() for marker in SAVED_MARKERS):
        loaded = datasets.load_from_disk(str(folder))
        if isinstance(loaded, datasets.DatasetDict):
            if params.split not in loaded:
                raise DatasetRecordError(f"{folder}: no split {params.split!r} (dataset.split); "
                                         f"splits: {', '.join(loaded)}")
            loaded = loaded[params.split]
        return loaded
    return datasets.load_dataset(params.path, params.name, data_files=list(params.data_files) or None,
                                 split=params.split)


class HuggingFaceDataset:
    """Prompts read from a ``datasets`` split with configurable prompt and ground-truth fields."""

    format = "huggingface"

    def __init__(self, params: HuggingFaceDatasetParams, seed: int = 0) -> None:
        self.params = params
        rows = load_rows(params)
        if params.limit:
            rows = rows.select(range(min(params.limit, len(rows))))
        if len(rows) == 0:
            raise DatasetRecordError(f"{params.path} ({params.split}): the split holds no rows")
        self.rows = rows
        self.where = f"{params.path} ({params.split})"
        self.get(0)  # fields are checked here, naming the columns, not at the first rollout

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, index: int) -> Prompt:
        """The prompt of row ``index`` (0-based)."""
        if not 0 <= index < len(self.rows):
            raise IndexError(f"{self.where}: row {index} out of range (0..{len(self) - 1})")
        return record_to_prompt(self.rows[index], self.params, index, f"{self.where} row {index}", self.format)
