"""TensorBoard tracker: scalar events under ``<run_dir>/tensorboard`` (``tensorboard --logdir``).

Written with ``torch.utils.tensorboard.SummaryWriter``, which needs the ``tensorboard`` package
(extra ``loongsage-core[tensorboard]``). Tags are the metric names (``rollout/reward_mean``),
so TensorBoard groups the curves by section. The flattened resolved config (``train.lr``) is
written as the run's hyperparameters (the HPARAMS tab; a list or None as its text), next to its
scalars. On resume the events of the resumed step and later are purged (``purge_step``), so a
step never shows twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from loongsage.tracking.base import SAMPLE_COLUMNS, Tracker
from loongsage.tracking.optional import finite, flatten, require


@dataclass
class TensorBoardParams:
    """Write TensorBoard scalar events to a folder of the run directory."""

    log_dir: str = "tensorboard"  # relative to the run directory
    flush_secs: int = 10  # seconds between flushes of the event file to disk

    def __post_init__(self) -> None:
        require("tensorboard", "tensorboard")


class TensorBoardTracker(Tracker):
    """One scalar event per metric and step."""

    def __init__(self, params, run_dir, config) -> None:
        super().__init__(params, run_dir, config)
        self.log_dir = self.run_dir / params.log_dir
        self._purge_step: int | None = None
        self._writer = None

    def truncate_before(self, step: int) -> None:
        """Resume at ``step``: events of ``step`` and later are dropped when writing starts."""
        self._purge_step = step

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.log_dir), purge_step=self._purge_step,
                                         flush_secs=self.params.flush_secs)
            self._write_hparams()
        for key, value in finite(metrics):
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def log_samples(self, rows: list[list], step: int) -> None:
        """The samples as one markdown table (TensorBoard's TEXT tab), tag ``samples``."""
        if self._writer is None:
            return
        def cell(value: object) -> str:
            return str(value).replace("|", "\\|").replace("\n", "<br>")

        lines = ["| " + " | ".join(SAMPLE_COLUMNS) + " |", "|" + "---|" * len(SAMPLE_COLUMNS)]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
        self._writer.add_text("samples", "\n".join(lines), step)
        self._writer.flush()

    def _write_hparams(self) -> None:
        """The config as this run's hyperparameters, in its own event file (no sub-run, unlike
        ``SummaryWriter.add_hparams``), so the HPARAMS tab lists it with the run's scalars."""
        from torch.utils.tensorboard.summary import hparams

        values = {key: value if isinstance(value, (bool, int, float, str)) else str(value)
                  for key, value in flatten(self.config).items()}
        for summary in hparams(values, {}):
            self._writer.file_writer.add_summary(summary)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
