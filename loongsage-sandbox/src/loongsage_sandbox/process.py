"""``process`` backend: the supervisor as a plain subprocess with rlimits. NOT a security boundary.

Commands run as the host user, see the host's whole file system and network, and when the
host user is root, ``RLIMIT_NPROC`` does not apply (the kernel exempts root), so a fork
bomb is not contained. Use it for trusted commands and for speed baselines; it refuses to
start with ``untrusted=True`` (the default, and what the code reward asks for) unless the
config sets ``allow_untrusted_code: true``. The work dir is ``<state dir>/work`` on the
host; the files API is confined to it (no ``..``, no symlinks followed). A timeout kills
the command's process group only: a child that calls ``setsid`` escapes it (the leftover
cleanup still finds it by its environment tag).
"""

from __future__ import annotations

import sys
from typing import Any

from loongsage_sandbox.supervisor_client import SUPERVISOR_SOURCE, SupervisedSandbox
from loongsage_sandbox.errors import UntrustedCodeRefusedError
from loongsage_sandbox.params import ProcessParams


class ProcessSandbox(SupervisedSandbox):
    """Plain subprocess with rlimits and a private work dir; not a security boundary."""

    params_type = ProcessParams
    backend = "process"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self.untrusted and not self.params.allow_untrusted_code:
            raise UntrustedCodeRefusedError(
                f"{self.key}.type: the 'process' sandbox is not a security boundary and refuses "
                f"untrusted code; use type 'bwrap' (or 'docker'/'remote'), or set "
                f"{self.key}.allow_untrusted_code: true if you accept the risk")

    def _launch_argv(self, supervisor_config: dict[str, Any]) -> list[str]:
        import json

        workdir = self.state.path / "work"
        supervisor_config.update(workdir=str(workdir), pidns=False)
        return [sys.executable, "-I", "-S", str(SUPERVISOR_SOURCE), json.dumps(supervisor_config)]

    def describe(self) -> str:
        return "process (rlimits only; not a security boundary)"
