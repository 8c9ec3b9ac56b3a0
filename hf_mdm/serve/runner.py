"""Running the server: in the foreground (`serve`, what ``hf-mdm serve`` calls) or in a background thread on a free
loopback port for tests and benchmarks (`running`), which stops by itself when its block ends.

Both stop by draining: the server keeps listening and answers new generation requests 503 while every request in
flight, streamed or not, finishes (at most ``drain_timeout_s``), then it shuts down. In the foreground SIGTERM and
Ctrl-C start the drain (a second Ctrl-C stops at once) and the process exits with 0; a model that cannot load stops
the server, and `serve` raises a ValueError saying why.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from typing import Any, Iterator, Optional

import uvicorn

from .app import DRAIN_TIMEOUT_S, ServerState

__all__ = ["serve", "running", "free_port"]


class _Server(uvicorn.Server):
    """uvicorn's server, stopped by draining (`drain`) instead of closing its socket first; SIGTERM / SIGINT start
    the drain and the process then exits with 0 (uvicorn re-raises the signal once it has shut down, which ends the
    process as killed by it)."""

    def __init__(self, config: uvicorn.Config, state: ServerState, drain_timeout_s: float):
        super().__init__(config)
        self.state, self.drain_timeout_s = state, drain_timeout_s
        self.drain_deadline: Optional[float] = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        originals = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.drain_deadline is not None and sig == signal.SIGINT:  # a second Ctrl-C: stop now
            self.should_exit = self.force_exit = True
        else:
            self.drain()

    def drain(self) -> None:
        """New generation requests get 503 from now on; the server stops once none is in flight."""
        if self.drain_deadline is None:
            self.drain_deadline = time.monotonic() + self.drain_timeout_s
            self.state.draining = True

    async def on_tick(self, counter: int) -> bool:
        drained = self.drain_deadline is not None and (
            self.state.in_flight == 0 or time.monotonic() > self.drain_deadline
        )
        if drained or self.state.load_error is not None:
            self.should_exit = True
        return await super().on_tick(counter)


def serve(app: Any, host: str, port: int, drain_timeout_s: float = DRAIN_TIMEOUT_S) -> None:
    """uvicorn in the foreground until SIGTERM / Ctrl-C and the drain; a ValueError if the model could not load."""
    state: ServerState = app.state.hf_mdm
    config = uvicorn.Config(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=drain_timeout_s)
    _Server(config, state, drain_timeout_s).run()
    if state.load_error is not None:
        raise ValueError(state.load_error)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running(app: Any, host: str = "127.0.0.1", startup_timeout_s: float = 30.0) -> Iterator[str]:
    """The app served on a free port of ``host`` in a thread; yields its base URL (``http://host:port``) and drains
    the server when the block ends."""
    port = free_port(host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    server = _Server(config, app.state.hf_mdm, DRAIN_TIMEOUT_S)
    thread = threading.Thread(target=server.run, name="hf-mdm-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError(f"the server did not start on {host}:{port} within {startup_timeout_s:.0f} s")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.drain()
        thread.join(timeout=DRAIN_TIMEOUT_S + 10)
