"""The server's settings: where it listens, what it serves, its limits and its batching."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["ServeSettings", "SCHEDULERS"]

SCHEDULERS = ("join", "micro-batch", "one")


@dataclass
class ServeSettings:
    """``hf-mdm serve``'s options (`hf_mdm.cli_serve`), with the defaults a local server wants.

    Limits: ``max_prompt_tokens`` and ``max_tokens`` (a request asking more is a 400), ``max_body_bytes`` (413),
    ``max_queue`` requests waiting (429 beyond). ``scheduler``: ``"join"`` (the default; masked diffusion models) runs
    up to ``max_batch`` requests each as its own call, their forwards batched, a new request joining at the next
    forward (`hf_mdm.serve.joining`), with keys/values of at most ``max_cache_tokens`` positions kept at once;
    ``"micro-batch"`` runs up to ``max_batch`` requests with one generation config as one call, after waiting at most
    ``max_wait_ms`` for more (`hf_mdm.serve.batcher`; what autoregressive and uniform-corruption models always get);
    ``"one"`` runs one request at a time. ``batch_invariant`` gives every response exactly what its request gets
    alone on any device (`hf_mdm.generation_rows`)."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: Optional[str] = None
    served_model_name: Optional[str] = None
    preset: Optional[str] = None  # the preset a request starts from when it names none (`generation_presets`)
    max_prompt_tokens: int = 4096
    max_tokens: int = 1024
    default_max_tokens: int = 128
    max_body_bytes: int = 1 << 20
    max_queue: int = 256
    max_batch: int = 16
    max_wait_ms: float = 5.0
    batch_invariant: bool = False
    scheduler: str = "join"
    max_cache_tokens: int = 65536

    def __post_init__(self) -> None:
        positive = ("max_prompt_tokens", "max_tokens", "default_max_tokens", "max_body_bytes", "max_queue", "max_batch")
        positive += ("max_cache_tokens",)
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {list(SCHEDULERS)}, got {self.scheduler!r}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {self.max_wait_ms!r}")
        if self.default_max_tokens > self.max_tokens:
            raise ValueError(f"default_max_tokens ({self.default_max_tokens}) exceeds max_tokens ({self.max_tokens})")
