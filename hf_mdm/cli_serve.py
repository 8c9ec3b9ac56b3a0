"""``hf-mdm serve``: the thin wiring of `hf_mdm.serve` onto the command line."""

from __future__ import annotations

import argparse
from typing import Any


def add_commands(commands: Any) -> None:
    """``hf-mdm serve``."""
    from .serve.settings import SCHEDULERS, ServeSettings

    defaults = ServeSettings()
    p = commands.add_parser("serve", help="serve a model behind an OpenAI-compatible HTTP API (needs hf_mdm[serve])")
    p.add_argument("model", help="a local checkpoint folder or a Hub id (diffusion or autoregressive)")
    p.add_argument(
        "--preset", help="start every request from this preset, as a request's preset field does (llada, llada2, ...)"
    )
    p.add_argument("--generation-config", help="start requests from this generation config (JSON file or folder)")
    p.add_argument("--host", default=defaults.host, help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=defaults.port)
    p.add_argument("--api-key", help="require Authorization: Bearer KEY")
    p.add_argument("--served-model-name", help="the model's id in the API (default: the MODEL argument)")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--quantization", choices=("int8", "int4"),
        help="weight-only quantization through torchao as the model loads (needs hf_mdm[quant]; load in bfloat16)",
    )  # fmt: skip
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--batch-invariant", action="store_true", help="every answer exactly what its request gets alone")
    p.add_argument(
        "--scheduler", choices=SCHEDULERS, default=defaults.scheduler,
        help="join: each request its own call, joining the running ones at their next forward (masked diffusion "
        "models; default); micro-batch: requests with one config as one call; one: a request at a time",
    )  # fmt: skip
    p.add_argument(
        "--max-cache-tokens", type=int, default=defaults.max_cache_tokens,
        help="join: positions of keys/values kept at once by running requests (a request that does not fit waits)",
    )  # fmt: skip
    for name in ("max_batch", "max_queue", "max_tokens", "max_prompt_tokens", "max_body_bytes", "default_max_tokens"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name))
    p.add_argument("--max-wait-ms", type=float, default=defaults.max_wait_ms)
    p.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from .quantization import quantization_config

    try:
        from .serve import Engine, ServeSettings, build_app, serve
        from .serve.loading import serving_config
    except ImportError as err:
        raise ValueError(f"hf-mdm serve needs the serve extra: pip install 'hf_mdm[serve]' ({err})") from err
    names = ("host", "port", "api_key", "max_batch", "max_queue", "max_tokens", "max_prompt_tokens", "max_body_bytes")
    names += ("default_max_tokens", "max_wait_ms", "batch_invariant", "scheduler", "max_cache_tokens", "preset")
    settings = ServeSettings(**{name: getattr(args, name) for name in names})
    config = serving_config(args.preset, args.generation_config)  # checked before the model loads
    quantization_config(args.quantization, args.device)  # torchao present, int4 on a device it packs for

    def loader() -> Engine:
        from .loading import load_pretrained

        pretrained = load_pretrained(
            args.model, dtype=args.dtype, device=args.device, trust_remote_code=args.trust_remote_code,
            quantization=args.quantization,
        )  # fmt: skip
        return Engine(pretrained.model, pretrained.tokenizer, settings, config)

    app = build_app(None, settings, args.served_model_name or args.model, loader=loader)
    serve(app, settings.host, settings.port)
    return 0
