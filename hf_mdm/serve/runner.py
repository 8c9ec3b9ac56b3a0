"""Running the server: in the foreground (`serve`, what ``hf-mdm serve`` calls) or in a background thread on a free
loopback port for tests and benchmarks (`running`), which stops by itself when its block ends."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from typing import Any, Iterator

import uvicorn

__all__ = ["serve", "running", "free_port"]


class _Server(uvicorn.Server):
    """uvicorn's server, whose SIGTERM / SIGINT shut it down gracefully and then let the process exit with 0 (uvicorn
    re-raises the signal once it has shut down, which ends the process as killed by it)."""

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


def serve(app: Any, host: str, port: int) -> None:
    """uvicorn in the foreground; SIGTERM / Ctrl-C drain in-flight requests, then the process exits with 0."""
    config = uvicorn.Config(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=60)
    _Server(config).run()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running(app: Any, host: str = "127.0.0.1", startup_timeout_s: float = 30.0) -> Iterator[str]:
    """The app served on a free port of ``host`` in a thread; yields its base URL (``http://host:port``) and shuts
    the server down (draining) when the block ends."""
    port = free_port(host)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
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
        server.should_exit = True
        thread.join(timeout=60)
