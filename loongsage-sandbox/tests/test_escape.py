"""Escape and exhaustion suite: hostile code against ``bwrap`` and ``remote`` (-> service -> bwrap).

Every test runs a real attack inside a real sandbox and checks two things: the host side
is untouched (the secret was not read, the listener got no connection, the host process is
alive, no process survived) and the sandbox *reported* what happened (exit status, signal,
``timed_out``, ``killed_processes``, a ``path_escape`` error), so a reward or agent can tell.
"""

from __future__ import annotations

import asyncio
import errno
import os
import secrets
import signal
import socket
import subprocess
import threading

from loongsage_sandbox.errors import SandboxCrashedError, SandboxError
from loongsage_sandbox.testing import host_processes_with


# what `ps -e -o comm=` prints, without needing procps inside the sandbox
LIST_PROCESSES = ["python3", "-c", "import os\nfor p in os.listdir('/proc'):\n    if p.isdigit():\n"
                  "        try: print(open(f'/proc/{p}/comm').read().strip())\n        except OSError: pass"]


def run(coro):
    return asyncio.run(coro)


def test_host_files_are_invisible(hostile, tmp_path):
    secret = secrets.token_hex(16)
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(secret)
    os.chmod(tmp_path, 0o755)
    secret_file.chmod(0o644)  # world-readable on the host: only the mount namespace can hide it
    home = os.path.expanduser("~")
    os.environ["LS_HOST_SECRET"] = secret

    async def attack():
        async with hostile() as sb:
            return await sb.exec(
                f"cat {secret_file}; cat /etc/shadow; ls -a /root {home}; ls {os.getcwd()}; "
                f"cat /proc/*/environ; env; echo done")

    r = run(attack())
    assert r.text.rstrip().endswith("done")
    assert secret not in r.text
    err = r.stderr.decode()
    assert f"{secret_file}: No such file or directory" in err
    assert "/etc/shadow: No such file or directory" in err
    assert "cannot access '/root'" in err
    assert "LOONGSAGE_SANDBOX_TOKEN" not in r.text  # the service's token never reaches sandboxed code
    assert "LS_HOST_SECRET" not in r.text and "PYTEST_CURRENT_TEST" not in r.text  # nor the host's env


def test_writes_outside_the_work_dir_fail(hostile, tmp_path):
    marker = f"pwned-{secrets.token_hex(4)}"
    host_target = tmp_path / marker
    os.chmod(tmp_path, 0o777)

    async def attack():
        async with hostile() as sb:
            return await sb.exec(
                f"for p in /usr/{marker} /etc/{marker} /{marker} /opt/loongsage/{marker} {host_target}; do "
                f"  echo x > $p 2>/dev/null && echo WROTE $p || echo DENIED $p; done; "
                f"echo ok > /work/inside && cat /work/inside")

    r = run(attack())
    assert "WROTE" not in r.text
    assert r.text.count("DENIED") == 5
    assert r.text.rstrip().endswith("ok")  # the work dir itself is writable
    assert not host_target.exists()
    assert not os.path.exists(f"/usr/{marker}") and not os.path.exists(f"/{marker}")


def test_no_network_to_the_hosts_loopback(hostile):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted = []
    stop = threading.Event()

    def accept_loop():
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept_loop, daemon=True)
    thread.start()
    code = ("import socket\n"
            f"for host in ('127.0.0.1', 'localhost', '::1'):\n"
            f"    try:\n"
            f"        socket.create_connection((host, {port}), timeout=2); print('CONNECTED', host)\n"
            f"    except OSError as e: print('refused', host, e.errno)\n"
            "print(open('/proc/net/dev').read().count(':'))")

    async def attack():
        async with hostile() as sb:
            return await sb.exec(["python3", "-c", code])

    try:
        r = run(attack())
    finally:
        stop.set()
        thread.join()
        listener.close()
    assert "CONNECTED" not in r.text, r.text
    assert r.text.count("refused") == 3
    assert r.text.split()[-1] == "1"  # only the sandbox's own (down) loopback interface exists
    assert accepted == []


def test_fork_bomb_is_capped_and_cleaned_up(hostile):
    counter = ("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
               "            time.sleep(60); os._exit(0)\n        n += 1\n"
               "except OSError as e:\n    print(n, e.errno)\n")

    async def attack():
        async with hostile({"max_processes": 32, "timeout_s": 3}) as sb:
            counted = await sb.exec(["python3", "-c", counter])
            await sb.reset()  # the counter's sleeping children still hold the process budget
            bomb = await sb.exec("b() { b | b & }; b", timeout=2)
            await sb.reset()  # bomb shells may still be failing to fork; reset kills them all
            left = await sb.exec(LIST_PROCESSES)
            return counted, bomb, left

    counted, bomb, left = run(attack())
    forks, err = map(int, counted.text.split())
    assert err == errno.EAGAIN
    assert 0 < forks < 32  # RLIMIT_NPROC stopped it; the supervisor and the shell count too
    assert b"Cannot fork" in bomb.stderr  # the classic bomb hit RLIMIT_NPROC and collapsed
    assert sorted(left.text.split()) == ["bwrap", "python3", "python3"]  # init, supervisor, this lister


def test_memory_bomb_is_refused(hostile):
    code = ("import sys\nok = bytearray(32 << 20)\nprint('32MB ok', flush=True)\n"
            "try:\n    bytearray(200 << 20)\nexcept MemoryError:\n    print('200MB MemoryError'); sys.exit(3)\n"
            "print('200MB allocated')\n")

    async def attack():
        async with hostile({"memory_mb": 128}) as sb:
            return await sb.exec(["python3", "-c", code])

    r = run(attack())
    assert r.text.split("\n")[:2] == ["32MB ok", "200MB MemoryError"]
    assert r.exit_code == 3


def test_cpu_spin_is_killed_by_the_cpu_limit_and_sleep_by_the_wall_limit(hostile):
    async def attack():
        async with hostile({"cpu_time_s": 1, "timeout_s": 20}) as sb:
            spin = await sb.exec(["python3", "-c", "while True: pass"])
            sleep = await sb.exec("sleep 30", timeout=1)
            return spin, sleep

    spin, sleep = run(attack())
    assert not spin.timed_out and spin.signal in (signal.SIGXCPU, signal.SIGKILL)
    assert spin.exit_code is None
    assert sleep.timed_out and sleep.signal == signal.SIGKILL


def test_filling_the_disk_stops_at_the_quota_and_reset_frees_it(hostile):
    fill = "for i in $(seq 1 20); do head -c 1000000 /dev/zero > f$i || { echo full at $i; break; }; done"

    async def attack():
        async with hostile({"disk_mb": 6, "max_file_size_mb": 1}) as sb:
            big = await sb.exec("head -c 1500000 /dev/zero > big; wc -c < big")
            filled = await sb.exec(fill)
            await sb.reset()
            after = await sb.exec("head -c 1000000 /dev/zero > again && echo written")
            return big, filled, after

    big, filled, after = run(attack())
    assert big.text.split() == [str(1 << 20)]  # RLIMIT_FSIZE cut the file at 1 MiB
    assert big.stderr == b"File size limit exceeded\n"  # the shell's report of SIGXFSZ
    assert filled.text.strip() in ("full at 6", "full at 7")  # 6 MiB tmpfs holds six 1 MB files
    assert b"No space left on device" in filled.stderr
    assert after.text.strip() == "written"


def test_files_api_refuses_traversal_and_symlinks(hostile):
    async def attack():
        async with hostile(files={"data/a.txt": "hello"}) as sb:
            await sb.exec("ln -s /etc etc_link; ln -s / root_link; ln -s /etc/passwd pw; ln -s data data_link")
            kinds = {}
            attempts = {
                "read ../": sb.read_file("../../etc/passwd"),
                "read abs": sb.read_file("/etc/passwd"),
                "read dir link": sb.read_file("etc_link/passwd"),
                "read file link": sb.read_file("pw"),
                "write ../": sb.write_file("../escape.txt", "x"),
                "write via link": sb.write_file("root_link/tmp/escape.txt", "x"),
                "write over link": sb.write_file("pw", "x"),
                "list via link": sb.list_files("data_link"),
            }
            for name, coro in attempts.items():
                try:
                    await coro
                    kinds[name] = "allowed"
                except SandboxError as err:
                    kinds[name] = err.kind
            inside = await sb.read_file("data/a.txt")
            listing = {e.name: e.type for e in await sb.list_files(".")}
            return kinds, inside, listing

    kinds, inside, listing = run(attack())
    assert kinds == {k: "path_escape" for k in kinds}, kinds
    assert inside == b"hello"
    assert listing == {"data": "dir", "data_link": "symlink", "etc_link": "symlink", "pw": "symlink",
                       "root_link": "symlink"}


def test_no_process_survives_a_timeout(hostile):
    tag = f"{313 + secrets.randbelow(1000)}"

    async def attack():
        async with hostile() as sb:
            r = await sb.exec(f"setsid sleep {tag} & (sleep {tag} &); nohup sleep {tag} >/dev/null & "
                              f"python3 -c 'import os,time; os.fork() or os.setsid(); time.sleep({tag})' & "
                              f"sleep {tag}", timeout=3)
            left = await sb.exec(LIST_PROCESSES)
            return r, left

    r, left = run(attack())
    assert r.timed_out
    assert r.killed_processes >= 5
    assert sorted(left.text.split()) == ["bwrap", "python3", "python3"]  # init, supervisor, this lister
    assert host_processes_with(f"sleep {tag}") == []


def test_cannot_signal_host_processes(hostile):
    victim = subprocess.Popen(["sleep", "120"])
    try:
        async def attack():
            async with hostile() as sb:
                try:
                    targeted = await sb.exec(f"kill -9 {victim.pid} {os.getpid()} 1; echo rc=$?")
                except SandboxCrashedError:
                    targeted = None
                try:
                    await sb.exec("kill -9 -1")
                    return targeted, "survived"
                except SandboxCrashedError:
                    return targeted, "sandbox crashed"

        targeted, outcome = run(attack())
        assert victim.poll() is None  # still running
        assert targeted is not None and "rc=1" in targeted.text
        assert "No such process" in targeted.stderr.decode() or "Operation not permitted" in targeted.stderr.decode()
        # kill -1 inside only reaches the sandbox's own processes (possibly its supervisor)
        assert outcome in ("survived", "sandbox crashed")
    finally:
        victim.kill()
        victim.wait()


def test_cannot_forge_supervisor_replies(hostile):
    forged = '{"ok": true, "exit_code": 0, "stdout": "Zm9yZ2Vk", "stderr": ""}'

    async def attack():
        async with hostile() as sb:
            r = await sb.exec(f"for p in /proc/[0-9]*/fd/1 /proc/[0-9]*/fd/0; do "
                              f"echo '{forged}' > $p 2>/dev/null && echo wrote $p; done; exit 5")
            nxt = await sb.exec("echo next")
            return r, nxt

    r, nxt = run(attack())
    assert r.exit_code == 5  # the genuine status, not the forged one
    # only the attacker's own stdout pipe (self and its children) is writable, never the protocol pipes
    assert all(line.split("/")[2] not in ("1", "2") for line in r.text.splitlines() if line.startswith("wrote"))
    assert nxt.text == "next\n"  # no injected line was queued on the protocol
