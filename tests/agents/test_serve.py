"""``loongsage serve`` as a user runs it: a real subprocess starts the embedded engine and the
router, prints base URLs; the openai and anthropic SDKs then use those URLs as printed, the
trajectories are listed, and Ctrl-C (SIGINT) stops it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")


def test_serve_prints_urls_that_agents_can_use():
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}  # SIGABRT dumps every thread
    proc = subprocess.Popen(
        [sys.executable, "-m", "loongsage.cli", "serve", "--config-name", "tiny/grpo",
         "rollout.num_threads=1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        # as from a terminal: a shell's background job (``make test &``) starts everything with
        # SIGINT ignored, and an ignored SIGINT never reaches Python's Ctrl-C handling
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "OPENAI_BASE_URL=" in line:
                break
        text = "".join(lines)
        match = re.search(r"OPENAI_BASE_URL=(\S+) ANTHROPIC_BASE_URL=(\S+)", text)
        assert match, text
        openai_url, anthropic_url = match.groups()
        assert openai_url.endswith("/demo/0/v1") and anthropic_url.endswith("/demo/0")
        assert re.search(r"engines: http://127\.0\.0\.1:\d+", text)

        reply = openai.OpenAI(base_url=openai_url, api_key="unused", max_retries=0).chat.completions.create(
            model="whatever-the-agent-says", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
        assert 1 <= reply.usage.completion_tokens <= 5
        msg = anthropic.Anthropic(base_url=anthropic_url.replace("/demo/", "/other/"), api_key="x",
                                  max_retries=0).messages.create(
            model="claude-anything", max_tokens=4, messages=[{"role": "user", "content": "hey"}])
        assert 1 <= msg.usage.output_tokens <= 4
        root = openai_url[: openai_url.index("/demo/")]
        listing = httpx.get(f"{root}/v1/trajectories").json()
        assert "demo" in str(listing) and "other" in str(listing)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # faulthandler prints where each thread is stuck
            stacks = proc.communicate(timeout=30)[0][-6000:]
            pytest.fail(f"loongsage serve did not exit within 30 s of Ctrl-C; its threads:\n{stacks}")


def test_serve_uses_running_engines_when_given(engine_url):
    import io

    from loongsage.controller.serve import run_serve

    out = io.StringIO()
    router, engines = run_serve("tiny/grpo", [], engine_urls=[engine_url], block=False, out=out)
    try:
        assert engines == [] and f"engines: {engine_url}" in out.getvalue()
        client = openai.OpenAI(base_url=router.base_urls("mine")["openai"], api_key="k", max_retries=0)
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=3)
        traj = httpx.get(f"{router.url}/v1/trajectories/mine").json()["attempts"][0]
        assert sum(traj["loss_mask"]) == reply.usage.completion_tokens
    finally:
        router.stop()


def test_serve_with_a_session_header_records_one_trajectory_per_session(engine_url):
    """verifiers' ``vf-eval`` sends every rollout with one API key and its own ``X-Session-ID``;
    with ``--session-header x-session-id`` each session is a trajectory of its own, its turns
    recorded token-exactly; requests without the header stay on the key's trajectory."""
    import io

    from loongsage.controller.serve import run_serve

    out = io.StringIO()
    router, _ = run_serve("tiny/grpo", [], engine_urls=[engine_url], block=False, out=out,
                          session_header="x-session-id")
    try:
        assert "a request with header x-session-id: S goes to trajectory '<trajectory_id>.S'" in out.getvalue()

        def client(session=None):
            headers = {"X-Session-ID": session} if session else None
            return openai.OpenAI(base_url=f"{router.url}/v1", api_key="vf-eval", max_retries=0,
                                 default_headers=headers)

        first = [{"role": "user", "content": "hi"}]
        sampled: dict[str, int] = {}
        replies: dict[str, str] = {}
        for session in ("rollout-0", "rollout-1", None):
            reply = client(session).chat.completions.create(model="m", messages=first, max_tokens=3)
            sampled[session or ""] = reply.usage.completion_tokens
            replies[session or ""] = reply.choices[0].message.content
        # a second turn of rollout-0 continues its own trajectory
        again = [*first, {"role": "assistant", "content": replies["rollout-0"]}, {"role": "user", "content": "and?"}]
        second = client("rollout-0").chat.completions.create(model="m", messages=again, max_tokens=3)
        sampled["rollout-0"] += second.usage.completion_tokens
        listing = httpx.get(f"{router.url}/v1/trajectories").json()["trajectories"]
        assert sorted(t["trajectory_id"] for t in listing) == ["vf-eval", "vf-eval.rollout-0", "vf-eval.rollout-1"]
        for tid, session in (("vf-eval.rollout-0", "rollout-0"), ("vf-eval.rollout-1", "rollout-1"), ("vf-eval", "")):
            [traj] = httpx.get(f"{router.url}/v1/trajectories/{tid}").json()["attempts"]
            assert sum(traj["loss_mask"]) == sampled[session], tid
        with pytest.raises(openai.BadRequestError, match="header x-session-id: expected 1 to 128"):
            client("a/b").chat.completions.create(model="m", messages=first, max_tokens=3)
    finally:
        router.stop()
