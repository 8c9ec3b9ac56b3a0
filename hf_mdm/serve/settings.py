"""The server's settings: where it listens, what it serves, its limits and its batching."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["ServeSettings"]


@dataclass
class ServeSettings:
    """``hf-mdm serve``'s options (`hf_mdm.cli_serve`), with the defaults a local server wants.

    Limits: ``max_prompt_tokens`` and ``max_tokens`` (a request asking more is a 400), ``max_body_bytes`` (413),
    ``max_queue`` requests waiting (429 beyond). Batching: up to ``max_batch`` requests with one generation config run
    as one call, after waiting at most ``max_wait_ms`` for more; on a block-causal model ``join_at_blocks`` runs
    requests one block at a time instead, a new one joining at the next block boundary (`hf_mdm.serve.joining`);
    ``batch_invariant`` gives every response exactly what its request gets alone (`hf_mdm.generation_rows`)."""

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
    join_at_blocks: bool = True

    def __post_init__(self) -> None:
        positive = ("max_prompt_tokens", "max_tokens", "default_max_tokens", "max_body_bytes", "max_queue", "max_batch")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {self.max_wait_ms!r}")
        if self.default_max_tokens > self.max_tokens:
            raise ValueError(f"default_max_tokens ({self.default_max_tokens}) exceeds max_tokens ({self.max_tokens})")
