"""The in-sandbox supervisor: runs commands under rlimits and serves the files API.

Every local backend (``process``, ``bwrap``, ``docker``) starts this one file as a long-lived
process *inside* its isolation boundary and talks to it over stdin/stdout, one JSON object
per line each way. That gives one implementation of exec, limits, output capping, process
tree killing and path confinement for all backends, and cheap execs (no namespace set-up
per command, which is what makes pooling pay off).

It must run on any Python 3 found inside the sandbox, so it imports only the standard
library and never ``loongsage``, and it stays one file (a little over our usual module
size) because it is shipped into the sandbox as a single file. Requests (binary data base64-encoded):

* ``{"op": "exec", "argv": [...], "stdin": b64|null, "timeout": s, "env": {}, "cwd": "rel"}``
* ``{"op": "write", "path": "rel", "data": b64, "mode": 0o644}``
* ``{"op": "read", "path": "rel", "max_bytes": n}``, ``{"op": "list", "path": "rel"}``
* ``{"op": "reset"}``, ``{"op": "shutdown"}``

Answers are ``{"ok": true, ...}`` or ``{"ok": false, "error": kind, "message": text}``.

Containment notes. With ``pidns`` (bwrap, docker: the supervisor shares a private PID namespace
with everything it starts) a timeout or reset kills *every* other process in the namespace
with ``kill(-1, SIGKILL)``, so double-forked or ``setsid`` children cannot survive. Without
it (``process``) only the command's process group is killed: not a security boundary. The
supervisor makes itself non-dumpable so code of the same uid cannot ptrace it or open its
protocol pipes through ``/proc``. Paths are resolved component by component with
``O_NOFOLLOW`` relative to the work directory, so ``..`` and symlinks cannot leave it.
"""

import base64
import json
import os
import resource
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import time

CHUNK = 65536


class SupervisorError(Exception):
    """A request the supervisor refuses; ``kind`` is a stable machine-readable label."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def _make_undumpable():
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


def split_path(path):
    """Split a relative sandbox path into components, refusing anything that could leave."""
    if not isinstance(path, str) or "\x00" in path:
        raise SupervisorError("bad_path", "path must be a string without NUL bytes")
    if path.startswith("/"):
        raise SupervisorError("path_escape", "path %r is absolute; paths are relative to the work dir" % path)
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise SupervisorError("path_escape", "path %r contains '..'" % path)
    return parts


def open_dir(root_fd, parts, create=False):
    """Open the directory ``parts`` under ``root_fd`` without following any symlink."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as err:
                raise _path_error(err, part) from None
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _path_error(err, part):
    import errno

    if err.errno in (errno.ELOOP, errno.ENOTDIR):
        return SupervisorError("path_escape", "%r is a symlink or not a directory; symlinks are not followed" % part)
    if err.errno == errno.ENOENT:
        return SupervisorError("not_found", "%r does not exist" % part)
    return SupervisorError("os_error", "%s: %s" % (part, err.strerror))


class Supervisor:
    def __init__(self, config):
        self.workdir = config["workdir"]
        self.limits = config.get("limits", {})
        self.max_output = int(config.get("max_output_bytes", 1 << 20))
        # kill(-1) is only safe inside a PID namespace of our own: verify, never trust the flag
        host_ns = config.get("host_pidns")
        self.pidns = bool(config.get("pidns")) and host_ns is not None and os.readlink("/proc/self/ns/pid") != host_ns
        self.base_env = dict(config.get("env", {}))
        self.scratch_dirs = list(config.get("scratch_dirs", []))
        os.makedirs(self.workdir, exist_ok=True)
        self.root_fd = os.open(self.workdir, os.O_RDONLY | os.O_DIRECTORY)
        self.groups = set()

    # -- processes ---------------------------------------------------------------
    def _preexec(self):
        os.setsid()
        pairs = (
            (resource.RLIMIT_CPU, self.limits.get("cpu_time_s")),
            (resource.RLIMIT_AS, self.limits.get("memory_bytes")),
            (resource.RLIMIT_NPROC, self.limits.get("max_processes")),
            (resource.RLIMIT_FSIZE, self.limits.get("max_file_size_bytes")),
            (resource.RLIMIT_NOFILE, self.limits.get("max_open_files")),
            (resource.RLIMIT_CORE, 0),
        )
        for which, value in pairs:
            if value is not None:
                resource.setrlimit(which, (int(value), int(value)))

    def kill_all(self):
        """Kill every process the sandbox started; returns how many were found alive."""
        found = 0
        for pgid in list(self.groups):
            try:
                os.killpg(pgid, signal.SIGKILL)
                found += 1
            except ProcessLookupError:
                pass
            self.groups.discard(pgid)
            for _ in range(200):  # killed means gone: wait until the kernel has removed them
                if not self._group_alive(pgid):
                    break
                time.sleep(0.005)
        if self.pidns:
            for _ in range(50):
                others = self._others()
                if not others:
                    break
                found = max(found, len(others))
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                time.sleep(0.005)
        self._reap()
        return found

    def _others(self):
        me = os.getpid()
        pids = []
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in (1, me):
                try:
                    with open("/proc/%s/stat" % name) as f:
                        state = f.read().rsplit(")", 1)[1].split()[0]
                except OSError:
                    continue
                if state != "Z":
                    pids.append(int(name))
        return pids

    @staticmethod
    def _group_alive(pgid):
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

    @staticmethod
    def _group_size(pgid):
        n = 0
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open("/proc/%s/stat" % name) as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if fields[0] != "Z" and int(fields[2]) == pgid:
                    n += 1
        return n

    @staticmethod
    def _reap():
        """Collect orphans reparented to us; only when we are the namespace's init."""
        if os.getpid() != 1:
            return
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def exec(self, req):
        argv = req.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise SupervisorError("bad_request", "exec.argv must be a non-empty list of strings")
        timeout = float(req.get("timeout") or self.limits.get("timeout_s") or 10.0)
        env = dict(self.base_env)
        env.update(req.get("env") or {})
        cwd_fd = open_dir(self.root_fd, split_path(req.get("cwd") or "."))
        stdin = base64.b64decode(req["stdin"]) if req.get("stdin") else b""
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=env, preexec_fn=self._child_setup(cwd_fd), close_fds=True,
            )
        except FileNotFoundError:
            raise SupervisorError("not_found", "command not found: %s" % argv[0]) from None
        except PermissionError:
            raise SupervisorError("permission", "command not executable: %s" % argv[0]) from None
        finally:
            os.close(cwd_fd)
        self.groups.add(proc.pid)
        out, err, timed_out = self._communicate(proc, stdin, start + timeout)
        killed = 0
        if timed_out:
            killed = len(self._others()) if self.pidns else self._group_size(proc.pid)
            self.groups.discard(proc.pid)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            self.kill_all()
        code = proc.wait()
        if not timed_out and not self.pidns and not self._group_alive(proc.pid):
            self.groups.discard(proc.pid)  # never killpg a group id the kernel may reuse
        return {
            "exit_code": code if code >= 0 else None,
            "signal": -code if code < 0 else None,
            "timed_out": timed_out,
            "stdout": base64.b64encode(bytes(out[0])).decode(),
            "stderr": base64.b64encode(bytes(err[0])).decode(),
            "stdout_truncated": out[1],
            "stderr_truncated": err[1],
            "duration_s": time.monotonic() - start,
            "killed_processes": killed,
        }

    def _child_setup(self, cwd_fd):
        def setup():
            os.fchdir(cwd_fd)
            self._preexec()

        return setup

    def _communicate(self, proc, stdin, deadline):
        sel = selectors.DefaultSelector()
        buffers = {proc.stdout: [bytearray(), False], proc.stderr: [bytearray(), False]}
        for f in buffers:
            os.set_blocking(f.fileno(), False)
            sel.register(f, selectors.EVENT_READ)
        pending = memoryview(stdin)
        if pending:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        timed_out = False
        exited_at = None
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out = proc.poll() is None
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > 0.2:
                break  # background children hold the pipes open; stop waiting for EOF
            wait = min(deadline - now, 0.05 if exited_at is not None else 0.5)
            for key, _ in sel.select(wait):
                f = key.fileobj
                if f is proc.stdin:
                    try:
                        pending = pending[os.write(f.fileno(), pending[:CHUNK]):]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(f)
                        f.close()
                    continue
                try:
                    data = os.read(f.fileno(), CHUNK)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(f)
                    continue
                buf = buffers[f]
                room = self.max_output - len(buf[0])
                if len(data) > room:
                    buf[1] = True
                buf[0] += data[: max(room, 0)]
        sel.close()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            try:
                f.close()
            except (OSError, ValueError):
                pass
        return buffers[proc.stdout], buffers[proc.stderr], timed_out

    # -- files ---------------------------------------------------------------
    def write(self, req):
        parts = split_path(req.get("path", ""))
        if not parts:
            raise SupervisorError("bad_path", "write needs a file path")
        data = base64.b64decode(req.get("data", ""))
        fsize = self.limits.get("max_file_size_bytes")
        if fsize is not None and len(data) > int(fsize):
            raise SupervisorError("too_large", "file of %d bytes exceeds the %d-byte file size limit" % (len(data), fsize))
        dir_fd = open_dir(self.root_fd, parts[:-1], create=True)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
            try:
                fd = os.open(parts[-1], flags, int(req.get("mode", 0o644)), dir_fd=dir_fd)
            except OSError as err:
                raise _path_error(err, parts[-1]) from None
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            except OSError as err:
                raise SupervisorError("disk_full" if err.errno == 28 else "os_error", "write %s: %s" % (req["path"], err.strerror)) from None
            finally:
                os.close(fd)
        finally:
            os.close(dir_fd)
        return {"bytes": len(data)}

    def read(self, req):
        parts = split_path(req.get("path", ""))
        if not parts:
            raise SupervisorError("bad_path", "read needs a file path")
        max_bytes = int(req.get("max_bytes", 16 << 20))
        dir_fd = open_dir(self.root_fd, parts[:-1])
        try:
            try:
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
            except OSError as err:
                raise _path_error(err, parts[-1]) from None
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise SupervisorError("not_a_file", "%r is not a regular file" % req["path"])
                if st.st_size > max_bytes:
                    raise SupervisorError("too_large", "%r has %d bytes, more than max_bytes=%d" % (req["path"], st.st_size, max_bytes))
                chunks = []
                while True:
                    chunk = os.read(fd, CHUNK)
                    if not chunk:
                        break
                    chunks.append(chunk)
            finally:
                os.close(fd)
        finally:
            os.close(dir_fd)
        return {"data": base64.b64encode(b"".join(chunks)).decode()}

    def list(self, req):
        fd = open_dir(self.root_fd, split_path(req.get("path") or "."))
        entries = []
        try:
            with os.scandir(fd) as it:
                for e in it:
                    st = e.stat(follow_symlinks=False)
                    kind = "symlink" if e.is_symlink() else "dir" if e.is_dir(follow_symlinks=False) else "file"
                    entries.append({"name": e.name, "type": kind, "size": st.st_size})
        finally:
            os.close(fd)
        return {"entries": sorted(entries, key=lambda x: x["name"])}

    def reset(self, _req):
        killed = self.kill_all()
        for path in [self.workdir] + self.scratch_dirs:
            if not os.path.isdir(path):
                continue
            for name in os.listdir(path):
                full = os.path.join(path, name)
                if os.path.isdir(full) and not os.path.islink(full):
                    shutil.rmtree(full, ignore_errors=True)
                else:
                    try:
                        os.unlink(full)
                    except OSError:
                        pass
        return {"killed_processes": killed}


def serve(config, fin, fout):
    supervisor = Supervisor(config)
    ops = {"exec": supervisor.exec, "write": supervisor.write, "read": supervisor.read,
           "list": supervisor.list, "reset": supervisor.reset}
    fout.write(json.dumps({"ok": True, "ready": True, "pid": os.getpid()}) + "\n")
    fout.flush()
    for line in fin:
        try:
            req = json.loads(line)
        except ValueError:
            reply = {"ok": False, "error": "bad_request", "message": "request is not JSON"}
        else:
            op = req.get("op")
            if op == "shutdown":
                supervisor.kill_all()
                fout.write(json.dumps({"ok": True}) + "\n")
                fout.flush()
                return
            try:
                if op not in ops:
                    raise SupervisorError("bad_request", "unknown op %r; expected one of %s" % (op, sorted(ops)))
                reply = dict(ops[op](req), ok=True)
            except SupervisorError as err:
                reply = {"ok": False, "error": err.kind, "message": str(err)}
            except OSError as err:
                reply = {"ok": False, "error": "os_error", "message": str(err)}
        fout.write(json.dumps(reply) + "\n")
        fout.flush()
    supervisor.kill_all()  # the host went away: leave nothing behind


def main():
    _make_undumpable()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    config = json.loads(sys.argv[1])
    fin = os.fdopen(os.dup(0), "r")
    fout = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    serve(config, fin, fout)


if __name__ == "__main__":
    main()
