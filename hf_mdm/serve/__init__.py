"""``hf-mdm serve``: an OpenAI-compatible server for every diffusion LM hf_mdm loads, and AR models beside them.

- `hf_mdm.serve.protocol`: the OpenAI request and response bodies (pydantic; 400s naming the field);
- `hf_mdm.serve.engine`: the model and tokenizer: configs checked as ``generate`` checks them, batches run;
- `hf_mdm.serve.joining`: continuous batching (each request its own call, joining the others at their next forward),
  over `hf_mdm.serve.forwards` (concurrent calls' forwards run batched, each row its own arithmetic);
- `hf_mdm.serve.batcher`: the micro-batcher (requests with one config run as one batch);
- `hf_mdm.serve.streaming`: chunks of final text only, joining to the whole answer;
- `hf_mdm.serve.app`: the FastAPI app (routes, limits, errors, metrics); `hf_mdm.serve.runner`: uvicorn, draining
  on SIGTERM / Ctrl-C.

Needs the ``serve`` extra (``pip install 'hf_mdm[serve]'``: FastAPI, uvicorn, sse-starlette, prometheus-client).
"""

from __future__ import annotations

from typing import Any

from .settings import ServeSettings

__all__ = ["build_app", "Engine", "ServeSettings", "running", "serve"]


def __getattr__(name: str) -> Any:
    """The server's pieces, imported on first use (the CLI's parser needs none of the serve extra)."""
    if name == "build_app":
        from .app import build_app

        return build_app
    if name == "Engine":
        from .engine import Engine

        return Engine
    if name in ("running", "serve"):
        from . import runner

        return getattr(runner, name)
    raise AttributeError(name)
