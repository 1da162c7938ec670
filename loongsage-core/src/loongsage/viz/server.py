"""``loongsage view``: a local web page over a run directory (loopback by default).

One static page (``page.html``) and a small JSON API over ``RunFiles``: the run's curves (the
series ``loongsage plot`` draws, drawn by the page as interactive charts: hover for values, drag
to zoom, double-click to reset, one line per run when others are given to compare), the steps with saved samples, the samples filtered by data
source, reward and length, and one sample's tokens with loss mask, rollout and train logprob,
their gap and weight version, plus its AgentFlow trajectory (segment tree, messages with tool
calls and results, reward row). Every request reads the files again, so the page follows a
live run as it writes.
"""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path
from typing import Any, Optional, Sequence

from loongsage.errors import LoongSageError
from loongsage.http_thread import ThreadedServer
from loongsage.viz.run_files import RunFiles

log = logging.getLogger(__name__)


def create_app(run_dir: str | Path, compare: Sequence[str | Path] = ()) -> Any:
    """The viewer's FastAPI app over ``run_dir``; the curves overlay the runs in ``compare``."""
    from fastapi import FastAPI, HTTPException, Query
    from fastapi.responses import HTMLResponse

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

    @app.get("/api/curves")
    def curves(metric: Optional[list[str]] = Query(None)) -> dict:
        from loongsage.viz.plot import run_curves

        return guarded(run_curves, [files.path, *compare], metric).as_json()

    @app.get("/api/logged")
    def logged() -> list:
        return sorted({key for row in files.metrics() for key in row if "/" in key})

    return app


def start_viewer(run_dir: str | Path, host: str = "127.0.0.1", port: int = 0,
                 compare: Sequence[str | Path] = ()) -> ThreadedServer:
    """Serve the viewer in a background thread; ``server.url`` is its address."""
    server = ThreadedServer(create_app(run_dir, compare), host, port, name="loongsage-view")
    server.start()
    return server


def serve_viewer(run_dir: str | Path, host: str = "127.0.0.1", port: int = 8765,
                 compare: Sequence[str | Path] = ()) -> None:
    """``loongsage view``: serve until interrupted, printing the address first."""
    import threading

    server = start_viewer(run_dir, host, port, compare)
    print(f"loongsage view: {server.url}  (run directory {Path(run_dir).resolve()}; Ctrl-C stops)", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
