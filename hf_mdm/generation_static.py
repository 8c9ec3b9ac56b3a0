"""Static shapes for the compiled model call: one shape for every forward of a block, on every cache path.

A forward compiled with static shapes (``compile_config.dynamic=False``, or a mode that replays CUDA graphs, which
need them) compiles a graph for every new shape of its inputs. Asked as in eager (logits at each step's still-masked
positions, a prefix span that shrinks block after block), a generate of 8 blocks would compile a graph for each
step width and span. Under static shapes (`hf_mdm.generation_denoiser.Denoiser.static_shapes`) the model call
keeps its inputs at fixed shapes instead, so a call compiles a few graphs (a full forward, a span forward) and a
second call none:

- the LM head runs over the block's fixed rows (`head_rows`: its whole width, whatever is still masked), and the
  positions a step needs are taken from them after the forward (`take_rows`), outside the compiled graph;
- a cached span (the prefix cache's block and what follows it, the dual cache's block, the exact block cache's
  columns not final yet) is padded to the widest span of the call (`fixed_width`) with copies of its last column:
  the copies compute the same keys/values as that column and write them to the same place, so the cache is the
  one eager builds and nothing attends to them twice;
- the keys/values of the prefix, dual and exact block caches live in buffers of fixed addresses written in place
  (`static_copy`: a cache refresh, a full forward, is copied into them; a span forward writes its columns there), so
  that under CUDA graphs a replay reads and writes the same memory; their length is a Python int
  (`hf_mdm.kv_cache.cached_length`), so a fullgraph trace has no branch on a tensor;
- every forward runs every row (`hf_mdm.generation_denoiser.Denoiser.fixed_rows`): a row with nothing to reveal
  in a step and a row that finished (an EOS, a stopping criterion) stay in the batch, the finished one's results
  dropped.

The tokens are eager's (the positions asked are the same, the extra rows are computed and dropped), but for scores
tied within a rounding error: a matrix product over another number of rows may round differently. The step's
proposals are computed at every column of the block too (`hf_mdm.generation_sampler`), so at temperature > 0 the
draws take another random stream than eager's (the same law). Exported with the model as remote code (imports
torch and transformers only).
"""

from __future__ import annotations

from typing import Any, Optional

import torch


def static_forward(compile_options: Optional[dict[str, Any]]) -> bool:
    """Whether the compiled forward of ``compile_options`` (`hf_mdm.generation_denoiser.compile_options`; None:
    eager) traces static shapes: ``dynamic=False``."""
    return compile_options is not None and compile_options.get("dynamic") is False


def window(start: int, end: int, width: int, length: int) -> tuple[int, int]:
    """[lo, lo + w): ``width`` consecutive columns of [0, ``length``) holding [``start``, ``end``) (w: at least
    ``end - start``, at most ``length``): from ``start``, moved left where they would pass ``length``."""
    width = min(max(width, end - start), length)
    lo = max(min(start, length - width), 0)
    return lo, lo + width


def head_rows(
    block: Optional[tuple[int, int]], width: int, query: torch.Tensor, shift: int, span: tuple[int, int]
) -> Optional[torch.Tensor]:
    """The rows of the model's input the LM head runs over: ``width`` consecutive rows holding the hidden states
    that predict the ``block``'s columns [start, end) (with a logits shift, one column earlier), counted in the
    input (``span``: its first canvas column and its length); None where the block is unknown or ``query`` asks
    more positions than that (the step then asks its own positions, e.g. every column, already a fixed shape)."""
    if block is None or query.shape[-1] > width:
        return None
    first = max(block[0] - shift, 0) - span[0]
    return torch.arange(*window(first, first + block[1] - block[0], width, span[1]), device=query.device)


def take_rows(logits: torch.Tensor, rows: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """The logits (B, K, V) at ``query`` (K,) or (B, K) (input rows) from ``logits`` (B, W, V) computed at the
    consecutive ``rows`` (W,). A query outside them (a slot no step writes, position 0) reads the nearest row."""
    index = (query - rows[0]).clamp(0, rows.numel() - 1)
    if index.dim() == 1:
        return logits[:, index]
    return logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1]))


def fixed_width(columns: torch.Tensor, width: int) -> torch.Tensor:
    """``columns`` (l,), a cached span's consecutive canvas columns, padded to ``width`` with copies of the last."""
    if columns.numel() >= width:
        return columns
    return torch.cat([columns, columns[-1:].expand(width - columns.numel())])


def static_copy(cache: Any, static: Any = None) -> Any:
    """``cache``'s keys/values (a full forward's, one layer each) in a transformers `Cache` of `StaticLayer`s:
    written in place into ``static``'s buffers where it has their shapes (the call's earlier refreshes), else into
    new buffers (marked static for torch.compile, `StaticLayer.lazy_initialization`) allocated at the canvas' length.
    Every later span forward writes into the same buffers (`hf_mdm.kv_cache.cached_keys_values`), so a forward
    compiled into CUDA graphs replays against the same memory; their length stays a Python int
    (`hf_mdm.kv_cache.cached_length`)."""
    from transformers.cache_utils import Cache, StaticLayer

    if static is not None and _same_shapes(static, cache):
        for kept, fresh in zip(static.layers, cache.layers):
            kept.keys.copy_(fresh.keys)
            kept.values.copy_(fresh.values)
        return static
    static = Cache(layers=[StaticLayer(layer.keys.shape[2]) for layer in cache.layers])
    for index, layer in enumerate(cache.layers):
        static.update(layer.keys, layer.values, index)
    return static


def _same_shapes(static: Any, cache: Any) -> bool:
    """Whether ``static``'s buffers have the shapes, dtypes and devices of ``cache``'s keys/values, layer by layer."""
    if len(static.layers) != len(cache.layers):
        return False
    return all(
        kept.keys.shape == fresh.keys.shape
        and kept.values.shape == fresh.values.shape
        and kept.keys.dtype == fresh.keys.dtype
        and kept.keys.device == fresh.keys.device
        for kept, fresh in zip(static.layers, cache.layers)
    )
