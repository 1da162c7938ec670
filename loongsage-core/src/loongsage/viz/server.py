"""``loongsage view``: a local web page over a run directory (loopback by default).

One static page (``page.html``) and a small JSON API over ``RunFiles``: the run's curves (the
PNG ``loongsage plot`` draws), the steps with saved samples, the samples filtered by data
source, reward and length, and one sample's tokens with loss mask, rollout and train logprob,
their gap and weight version, plus its AgentFlow trajectory (segment tree, messages with tool
calls and results, reward row). Every request reads the files again, so the page follows a
live run as it writes.
"""

from __future__ import annotations

import io
import logging
from importlib import resources
from pathlib import Path
from typing import Any, Optional

from loongsage.errors import LoongSageError
from loongsage.http_thread import ThreadedServer
from loongsage.viz.run_files import RunFiles

log = logging.getLogger(__name__)


def create_app(run_dir: str | Path) -> Any:
    """The viewer's FastAPI app over ``run_dir``."""
    from fastapi import FastAPI, HTTPException, Query
    from fastapi.responses import HTMLResponse, Response

    files = RunFiles(run_dir)
    app = FastAPI(title="loongsage view", docs_url=None, redoc_url=None)
    page = (resources.files("loongsage.viz") / "page.html").read_text(encoding="utf-8")

    def guarded(fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except LoongSageError as err:
            raise HTTPException(status_code=404, detail=str(err)) from None

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return page

    @app.get("/api/run")
    def run() -> dict:
        cfg = files.config()
        return {"path": str(files.path), "model": (cfg.get("model") or {}).get("path"),
                "algorithm": cfg.get("algorithm"), "steps": (cfg.get("trainer") or {}).get("steps"),
                "sources": [s.get("name") for s in cfg.get("data_sources") or []]}

    @app.get("/api/metrics")
    def metrics() -> list:
        return files.metrics()

    @app.get("/api/steps")
    def steps() -> list:
        return files.steps()

    @app.get("/api/samples")
    def samples(step: Optional[int] = None, source: Optional[str] = None,
                min_reward: Optional[float] = None, max_reward: Optional[float] = None,
                min_length: Optional[int] = Query(None, ge=0), max_length: Optional[int] = Query(None, ge=0),
                group_id: Optional[int] = None) -> list:
        return guarded(files.find_samples, step, source or None, min_reward, max_reward, min_length, max_length,
                       group_id)

    @app.get("/api/samples/{step}/{index}")
    def sample(step: int, index: int) -> dict:
        return guarded(files.sample_detail, step, index)

    @app.get("/api/curves.png")
    def curves() -> Response:
        from loongsage.viz.plot import plot_runs

        buffer = io.BytesIO()
        guarded(plot_runs, [files.path]).figure.savefig(buffer, format="png", dpi=80)
        return Response(buffer.getvalue(), media_type="image/png")

    return app


def start_viewer(run_dir: str | Path, host: str = "127.0.0.1", port: int = 0) -> ThreadedServer:
    """Serve the viewer in a background thread; ``server.url`` is its address."""
    server = ThreadedServer(create_app(run_dir), host, port, name="loongsage-view")
    server.start()
    return server


def serve_viewer(run_dir: str | Path, host: str = "127.0.0.1", port: int = 8765) -> None:
    """``loongsage view``: serve until interrupted, printing the address first."""
    import threading

    server = start_viewer(run_dir, host, port)
    print(f"loongsage view: {server.url}  (run directory {Path(run_dir).resolve()}; Ctrl-C stops)", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
