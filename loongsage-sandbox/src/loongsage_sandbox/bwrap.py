"""``bwrap`` backend: bubblewrap namespaces around the supervisor; the default where bwrap exists.

Isolation (bubblewrap 0.8, Debian package ``bubblewrap``):

* new user, pid, net, ipc, uts and cgroup namespaces (``--unshare-all``), no nested user
  namespaces (``--disable-userns``), all capabilities dropped, ``--new-session`` (no
  TIOCSTI into the host terminal), ``--die-with-parent``, a cleared environment;
* only ``/usr`` (and its merged-usr links), a short allow-list of ``/etc`` files and any
  ``ro_binds`` are visible, read-only: the host's ``/root``, ``/home``, ``/etc/shadow``,
  the repository and ``/tmp`` do not exist inside; ``/work`` and ``/tmp`` are private tmpfs
  mounts capped at ``disk_mb``;
* inside, everything runs as uid 65534. When the host process is root, bubblewrap itself
  is started as an unprivileged host uid (``host_uid``, default ``200000 + slot``): mapped
  to host root, the sandbox user would own root's files and be exempt from
  ``RLIMIT_NPROC`` (the kernel never applies it to root), so a fork bomb would be free;
* the supervisor shares the sandbox's PID namespace, so a timeout or reset kills every process
  in it, however it was forked.

The supervisor's source reaches the sandbox through ``--ro-bind-data`` from a memfd, so no host
path of this package needs to be readable by the unprivileged uid.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import zlib
from typing import Any

from loongsage.plugin import ConfigError

from loongsage_sandbox import leftovers
from loongsage_sandbox.supervisor_client import SUPERVISOR_SOURCE, SupervisedSandbox
from loongsage_sandbox.errors import SandboxCrashedError, SandboxUnavailableError
from loongsage_sandbox.params import BwrapParams

SANDBOX_UID = 65534
SUPERVISOR_PATH = "/opt/loongsage/supervisor.py"
ETC_ALLOW = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime",
             "python3*", "mime.types", "ssl/openssl.cnf")


class BwrapSandbox(SupervisedSandbox):
    """bubblewrap: user/pid/net/ipc/uts namespaces, read-only /usr, tmpfs /work, uid 65534."""

    params_type = BwrapParams
    backend = "bwrap"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        p = self.params
        self._bwrap = shutil.which(p.bwrap_path)
        if self._bwrap is None:
            raise SandboxUnavailableError(
                f"{self.key}.bwrap_path: bubblewrap ('{p.bwrap_path}') is not installed; on Debian/Ubuntu "
                f"run 'apt-get install -y bubblewrap', or choose another sandbox type")
        if not os.path.isabs(p.python) or not os.path.exists(p.python):
            raise ConfigError(f"{self.key}.python", f"must be an absolute path to an existing "
                                                    f"interpreter, got {p.python!r}")
        for path in p.ro_binds:
            if not os.path.isabs(path) or not os.path.exists(path):
                raise ConfigError(f"{self.key}.ro_binds", f"{path!r} is not an existing absolute path")

    def _host_uid(self) -> int | None:
        if os.geteuid() != 0:
            return None
        if self.params.host_uid is not None:
            return int(self.params.host_uid)
        return 200000 + zlib.crc32(self.state.id.encode()) % 60000

    def _mounts(self) -> list[str]:
        args = ["--ro-bind", "/usr", "/usr"]
        for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            path = "/" + top
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        for pattern in ETC_ALLOW:
            for path in sorted(glob.glob("/etc/" + pattern)):
                args += ["--ro-bind", path, path]
        for path in self.params.ro_binds:
            args += ["--ro-bind", path, path]
        return args

    def _launch_argv(self, supervisor_config: dict[str, Any]) -> list[str]:
        p = self.params
        disk = str(int(p.disk_mb) << 20)
        supervisor_config.update(workdir="/work", pidns=True, scratch_dirs=["/tmp"])
        self._supervisor_fd = _memfd(SUPERVISOR_SOURCE.read_bytes())
        return [
            self._bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox",
            "--clearenv", "--setenv", "PATH", "/usr/bin:/bin",
            *self._mounts(),
            "--proc", "/proc", "--dev", "/dev",
            "--size", disk, "--tmpfs", "/work", "--size", disk, "--tmpfs", "/tmp",
            "--ro-bind-data", str(self._supervisor_fd), SUPERVISOR_PATH,
            "--remount-ro", "/", "--chdir", "/work",
            p.python, "-I", "-S", SUPERVISOR_PATH, json.dumps(supervisor_config),
        ]

    def _launch_env(self) -> dict[str, str]:
        """Minimal: bwrap's own environment is readable inside (/proc/1/environ), so no host secrets."""
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), leftovers.ENV_MARKER: self.state.id}

    def _launch_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"pass_fds": (self._supervisor_fd,), "cwd": "/"}
        uid = self._host_uid()
        if uid is not None:
            kwargs.update(user=uid, group=uid, extra_groups=[])
        return kwargs

    async def _start(self) -> None:
        try:
            await super()._start()
        except SandboxCrashedError as err:
            raise SandboxUnavailableError(
                f"{self.key}: bubblewrap could not start a sandbox here ({err}). It needs user "
                f"namespaces (sysctl user.max_user_namespaces > 0; on Ubuntu also "
                f"kernel.apparmor_restrict_unprivileged_userns=0)") from None

    def describe(self) -> str:
        uid = self._host_uid() if self.state else None
        return f"bwrap (namespaces, uid {SANDBOX_UID} inside" + (f", host uid {uid})" if uid else ")")


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("loongsage-supervisor")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
