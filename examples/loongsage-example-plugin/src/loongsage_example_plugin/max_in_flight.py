"""A window policy bounding the groups being generated at once, below the pipeline's capacity
(e.g. to keep a shared sandbox service under a concurrency limit)."""

from loongsage.plugin import WindowPolicy


class MaxInFlight(WindowPolicy):
    def dispatch_count(self, view):
        return max(0, min(view.free, self.params.limit - view.in_flight))
