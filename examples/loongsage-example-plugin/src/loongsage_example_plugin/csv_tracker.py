"""A tracker writing one CSV row per step, to show the tracker contract."""

import csv

from loongsage.plugin import Tracker


class CsvTracker(Tracker):
    """One row per step: the step number and the configured metric columns."""

    def __init__(self, params, run_dir, config):
        super().__init__(params, run_dir, config)
        self._handle = open(self.run_dir / params.filename, "a", newline="", encoding="utf-8")
        self._writer = csv.writer(self._handle)
        if self._handle.tell() == 0:
            self._writer.writerow(["step", *params.columns])

    def log(self, metrics, step):
        self._writer.writerow([step, *(metrics.get(c, "") for c in self.params.columns)])
        self._handle.flush()

    def close(self):
        self._handle.close()
