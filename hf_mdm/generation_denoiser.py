"""The one model call of the reverse process: logits at the positions a step needs, guidance and shift applied.

`Denoiser` wraps any model whose output has ``.logits`` (hf_mdm's models, LLaDA, Dream, remote code, the
exact-posterior oracle) and is the only place that calls it:

- ``logits_to_keep``: passed when the model's ``forward`` names it (as a (K,) column list, or (B, K) positions per
  row for models that declare ``supports_per_row_logits_to_keep``), so the LM head runs only where needed;
- the logits shift: a model with ``logits_shift`` 1 (Dream) predicts position i from hidden state i - 1
  (`logits_shift_of`);
- classifier-free guidance: the unconditional input is the canvas with the prompt masked, run in the same batch,
  and logits = u + (s + 1)(c - u) (`classifier_free_guidance`);
- the count of forward passes (``nfe``; guidance counts two), of the canvas rows they ran (``forward_rows``;
  guidance's unconditional rows included) and of the positions they computed (``forward_tokens``: rows x input
  length, summed);
- the approximate block caches of Fast-dLLM (``kv_cache``, models that declare ``supports_diffusion_cache``; see
  `hf_mdm.kv_cache`): the first forward of a block (and every ``kv_cache_refresh``-th) runs the whole canvas and
  keeps every layer's keys/values; the block's other forwards run only the block and what follows it
  (``"prefix"``) or the block alone (``"dual"``) against them. With a logits shift the span starts one column
  before the block, so the logits predicting the block's first position come from a fresh hidden state;
- ``compile_forward``: the model's forward compiled with ``torch.compile`` (`compile_options`, `compiled_forward`),
  once per model and options and kept on the model, so later calls reuse its graphs; with static shapes
  (``dynamic=False``, CUDA graphs: `Denoiser.static_shapes`) every forward of a block keeps one shape: the LM head
  over the block's fixed rows, a cached span at a fixed width (`hf_mdm.generation_static`);
- block-causal models (`attention_block_size`: ``config.block_size`` set): every forward takes ``block_size`` = the
  decoding block length, so attention blocks are the decoding blocks (as LLaDA2's generate builds its mask), and
  the rows' positions when they are padded (a row's blocks count from its first token). Under such attention a
  block never sees later columns and completed blocks never change, so ``kv_cache`` is exact (``"prefix"`` and
  ``"dual"`` alike): one full forward fills the cache, and every later forward computes only the columns whose
  keys/values are not final yet, the current block (on a block's first forward, also what changed since the
  last one: the block before it). Tokens equal ``kv_cache=None`` exactly.

Transfers and strategies never see the model nor the cache; the denoiser knows nothing of them: the loop only says
where a block starts (`Denoiser.begin_block`). Exported with the model as remote code (imports torch and
`hf_mdm.kv_cache`).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from transformers import CompileConfig

from .families import attention_block_size, facts_of
from .generation_static import fixed_width, head_rows, static_copy, static_forward, take_rows, window
from .kv_cache import output_cache
from .modeling_blocks import shift_logits


def accepts(model: Any, name: str) -> bool:
    """Whether ``model.forward`` takes an argument ``name`` (each function's parameters read once)."""
    forward = getattr(model, "forward", None)
    try:
        return name in _parameters(getattr(forward, "__func__", forward))
    except (TypeError, ValueError):
        return False


@functools.lru_cache(maxsize=256)
def _parameters(function: Callable) -> frozenset[str]:
    return frozenset(inspect.signature(function).parameters)


def logits_shift_of(model: Any, config: Any = None) -> int:
    """1 if ``model`` predicts position i from hidden state i-1 (Dream), else 0: the generation config's
    ``logits_shift`` if set, else the model config's, else what the model's family declares (`facts_of`), else 0."""
    if config is not None and getattr(config, "logits_shift", None) is not None:
        return int(config.logits_shift)
    shift = getattr(getattr(model, "config", None), "logits_shift", None)
    if shift is None:
        facts = facts_of(model)
        shift = facts.logits_shift if facts is not None else 0
    return int(shift)


def _attention_block(model: Any, block_length: Optional[int]) -> Optional[int]:
    """The attention block of a block-causal model's forwards: the decoding ``block_length``, else the model's own
    (`attention_block_size`); None for a bidirectional model."""
    own = attention_block_size(model)
    if own is None:
        return None
    return int(block_length) if block_length is not None else own


def classifier_free_guidance(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """Guided logits u + (scale + 1)(c - u) (scale 0: the conditional logits)."""
    return uncond + (scale + 1.0) * (cond - uncond)


@dataclass
class Rows:
    """Canvas rows as the model sees them: ids ``x`` (B, L), attention mask ``attn`` (B, L) or None (nothing
    padded), ``prompt_mask`` (B, L) True at the prompt (masked in guidance's unconditional input)."""

    x: torch.Tensor
    attn: Optional[torch.Tensor]
    prompt_mask: torch.Tensor
    index: Optional[torch.Tensor] = None  # (B,) the canvas row of each row; None: the canvas' own rows

    def select(self, index: torch.Tensor) -> "Rows":
        """The rows ``index`` (copies: write ``x`` back to keep changes)."""
        canvas_rows = index if self.index is None else self.index[index]
        return Rows(
            self.x[index], None if self.attn is None else self.attn[index], self.prompt_mask[index], canvas_rows
        )

    def canvas_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """The canvas row of each of ``rows`` (indices into these rows)."""
        return rows if self.index is None else self.index[rows]


KV_CACHES = ("prefix", "dual")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile modes that replay CUDA graphs
_COMPILED_FORWARDS = "_hf_mdm_compiled_forwards"  # the attribute of a model that keeps its compiled forwards


def compile_options(config: Any) -> Optional[dict[str, Any]]:
    """The ``torch.compile`` arguments of the model call of ``config``, or None (eager): ``compile_forward=True``
    without ``disable_compile``. From ``config.compile_config`` (a `transformers.CompileConfig`) when given:
    ``fullgraph``, ``backend``, ``dynamic`` (None, CompileConfig's default, reads True: the positions a step asks
    logits for change in number from step to step; with False the model call keeps one shape a block instead,
    `hf_mdm.generation_static`), and for the
    inductor backend ``options`` or else ``mode``; without it, ``dynamic=True`` with inductor's default mode."""
    if not getattr(config, "compile_forward", False) or getattr(config, "disable_compile", False):
        return None
    compile_config = getattr(config, "compile_config", None)
    if compile_config is None:
        return {"dynamic": True, "fullgraph": False, "backend": "inductor"}
    dynamic = True if compile_config.dynamic is None else bool(compile_config.dynamic)
    options = {"dynamic": dynamic, "fullgraph": bool(compile_config.fullgraph), "backend": compile_config.backend}
    if compile_config.backend == "inductor":
        if compile_config.options:
            options["options"] = dict(compile_config.options)
        elif compile_config.mode is not None:
            options["mode"] = compile_config.mode
    return options


def check_compile(config: Any) -> None:
    """ValueErrors, naming what to change, for ``compile_forward``, ``disable_compile`` and ``compile_config``
    values that cannot run."""
    for name in ("compile_forward", "disable_compile"):
        value = getattr(config, name, None)
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")
    compile_config = getattr(config, "compile_config", None)
    if compile_config is None:
        return
    if not isinstance(compile_config, CompileConfig):
        raise ValueError(
            f"compile_config must be a transformers.CompileConfig, e.g. CompileConfig(backend='inductor', "
            f"dynamic=True), got {type(compile_config).__name__}"
        )
    if not config.compile_forward:
        raise ValueError("compile_config is read only with compile_forward=True: set compile_forward=True, or drop it")
    backend = compile_config.backend
    if isinstance(backend, str):
        known = torch.compiler.list_backends(exclude_tags=())
        if backend not in known:
            raise ValueError(f"unknown torch.compile backend {backend!r} in compile_config: use one of {known}")
    elif not callable(backend):
        raise ValueError(f"compile_config.backend must be a backend name or a callable, got {backend!r}")
    if compile_config.dynamic not in (None, True, False):
        raise ValueError(f"compile_config.dynamic must be True, False or None, got {compile_config.dynamic!r}")


def compiled_forward(model: Any, options: dict[str, Any]) -> Callable[..., Any]:
    """``torch.compile(model.forward, **options)``, compiled once per model and ``options``: kept on the model
    (not in a global), so every later call with the same options reuses its graphs."""
    compiled = model.__dict__.setdefault(_COMPILED_FORWARDS, {})
    key = tuple(sorted((name, repr(value)) for name, value in options.items()))
    if key not in compiled:
        compiled[key] = torch.compile(getattr(model, "forward", model), **options)
    return compiled[key]


def supports_kv_cache(model: Any) -> bool:
    """Whether ``model.forward`` keeps keys/values across denoising steps as `hf_mdm.kv_cache` describes."""
    return bool(getattr(model, "supports_diffusion_cache", False)) and accepts(model, "cache_position")


def model_device(model: Any) -> torch.device:
    """The device of the model's first parameter (the CPU for a model without any)."""
    parameter = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return parameter.device if parameter is not None else torch.device("cpu")


@dataclass
class BlockCache:
    """The keys/values of the current block (``kv_cache``): the block's columns, the cache, forwards run so far."""

    start: int
    end: int
    cache: Any = None
    forwards: int = 0
    span: Optional[torch.Tensor] = None  # the columns of its span forwards (the same at every step of the block)


@dataclass
class ExactCache:
    """The exact cache of a block-causal model, kept across blocks: the keys/values, the canvas rows they hold
    (a forward on fewer rows, once some finished, starts a new one) and ``final``, the column before which every
    cached key/value is final."""

    cache: Any = None
    rows: int = 0
    final: int = 0


@dataclass
class Denoiser:
    """Logits of a model at the positions a step needs (see the module docstring); counts its forward passes."""

    model: Any
    mask_id: int
    shift: int = 0
    cfg_scale: float = 0.0
    pass_logits_to_keep: bool = False
    per_row_logits: bool = False  # the model takes logits_to_keep as (B, K) positions per row
    kv_cache: Optional[str] = None
    kv_cache_refresh: Optional[int] = None
    block_size: Optional[int] = None  # block-causal models: the attention block of every forward (block_length)
    pass_block_size: bool = False
    forward: Optional[Callable[..., Any]] = None  # the compiled forward (`compiled_forward`); None: the model itself
    cuda_graphs: bool = False  # the compiled forward replays CUDA graphs: a step asks logits at fixed positions
    static_forward: bool = False  # the compiled forward traces static shapes (dynamic=False): see `static_shapes`
    static: Any = None  # under static shapes, the call's keys/values in buffers written in place (`static_copy`)
    hidden_from: Optional[int] = None  # columns from here on are computed but never attended to (hide_block_tail)
    nfe: int = 0
    forward_rows: int = 0
    forward_tokens: int = 0
    block: Optional[BlockCache] = None
    exact: Optional[ExactCache] = None
    columns: Optional[tuple[int, int]] = None  # the current block's columns [start, end) (`begin_block`)
    block_length: int = 0  # the decoding blocks' length: under static shapes, the LM head's rows (`head_rows`)
    span_width: int = 0  # under static shapes, the widest cached span of the call: every span is padded to it

    @classmethod
    def for_model(
        cls,
        model: Any,
        mask_id: int,
        cfg_scale: float = 0.0,
        shift: Optional[int] = None,
        kv_cache: Optional[str] = None,
        kv_cache_refresh: Optional[int] = None,
        block_length: Optional[int] = None,
        compile: Optional[dict[str, Any]] = None,
        hidden_from: Optional[int] = None,
    ) -> "Denoiser":
        """A denoiser for ``model``; ``shift`` defaults to `logits_shift_of` the model; ``block_length`` is the
        attention block of a block-causal model's forwards (default its own); ``compile``: the ``torch.compile``
        arguments of its forward (`compile_options`), None for eager; ``hidden_from``: the first column no query
        attends to (None: every column). A ValueError when ``kv_cache`` is asked of a model that cannot keep
        keys/values."""
        if kv_cache is not None and not supports_kv_cache(model):
            raise ValueError(
                f"kv_cache={kv_cache!r} needs a model whose forward keeps keys/values across steps (cache "
                f"and cache_position, as hf_mdm.kv_cache describes: MDMForMaskedDiffusion, LLaDAModelLM, DreamModel); "
                f"{type(model).__name__} does not: drop kv_cache"
            )
        cuda_graphs = compile is not None and compile.get("mode") in CUDA_GRAPH_MODES
        if cuda_graphs and model_device(model).type != "cuda":
            raise ValueError(
                f"compile_config.mode={compile['mode']!r} replays CUDA graphs, which need the model on a CUDA device "
                f"(it is on {model_device(model)}): move the model to CUDA, or use mode='default'"
            )
        return cls(
            model=model,
            mask_id=int(mask_id),
            shift=logits_shift_of(model) if shift is None else int(shift),
            cfg_scale=float(cfg_scale or 0.0),
            pass_logits_to_keep=accepts(model, "logits_to_keep"),
            per_row_logits=bool(getattr(model, "supports_per_row_logits_to_keep", False)),
            kv_cache=kv_cache,
            kv_cache_refresh=kv_cache_refresh,
            block_size=_attention_block(model, block_length),
            pass_block_size=accepts(model, "block_size"),
            exact=ExactCache() if kv_cache is not None and attention_block_size(model) is not None else None,
            forward=None if compile is None else compiled_forward(model, compile),
            cuda_graphs=cuda_graphs,
            static_forward=static_forward(compile),
            block_length=int(block_length or 0),
            hidden_from=hidden_from,
        )

    @property
    def block_causal(self) -> bool:
        """Whether the model attends block-causally (its decoding blocks are then aligned to attention blocks)."""
        return self.block_size is not None

    @property
    def static_shapes(self) -> bool:
        """Whether every forward of a block keeps one shape (`hf_mdm.generation_static`): a compiled forward with
        static shapes, or replaying CUDA graphs. The LM head then runs over the block's fixed rows and a cached span
        is padded to a fixed width; a step asks logits at every column of its block."""
        return self.cuda_graphs or self.static_forward

    def fixed_columns(self, length: int) -> Optional[tuple[int, int]]:
        """Under static shapes, the columns [lo, hi) a step asks logits at, of a canvas of ``length``: the current
        block's, widened to ``block_length`` (a shorter block, at the end: columns before it, never revealed), so
        that every step of every block has one shape; else None."""
        if not self.static_shapes or self.columns is None:
            return None
        return window(*self.columns, self.block_length, length)

    @property
    def static_cache(self) -> bool:
        """Whether keys/values are kept in buffers of fixed addresses written in place (`static_copy`): a cache under
        static shapes (CUDA graphs' replays read and write the same memory)."""
        return self.static_shapes and self.kv_cache is not None

    @property
    def guided(self) -> bool:
        return self.cfg_scale > 0

    @property
    def fixed_rows(self) -> bool:
        """Whether every forward runs every canvas row, finished or not: under static shapes (a batch that shrinks
        would be a new graph, a new CUDA graph recorded)."""
        return self.static_shapes

    @property
    def row_subsets(self) -> bool:
        """Whether a step may run the model on some of the block's rows only (not with a cache of all of them, nor
        with `fixed_rows`)."""
        return self.kv_cache is None and not self.fixed_rows

    def begin_block(self, start: int, end: int) -> None:
        """A semi-autoregressive block of columns [start, end) begins: the next forward refreshes the cache."""
        self.block = BlockCache(start, end) if self.kv_cache is not None else None
        self.columns = (start, end)

    def logits(self, rows: Rows, keep: torch.Tensor) -> torch.Tensor:
        """Logits predicting the tokens at positions ``keep``: (B, K, V) for columns ``keep`` (K,), or for per-row
        positions ``keep`` (B, K) with models that support it."""
        query = (keep - 1).clamp(min=0) if self.shift else keep
        inputs, mask = rows.x, rows.attn
        if self.guided:
            inputs = torch.cat([rows.x, rows.x.masked_fill(rows.prompt_mask, self.mask_id)])
            mask = None if mask is None else torch.cat([mask, mask])
            query = torch.cat([query, query]) if query.dim() == 2 else query
        kwargs: dict[str, Any] = {}
        if mask is not None:
            kwargs["attention_mask"] = mask
        self._block_arguments(mask, kwargs)
        self._hide_columns(inputs, mask, kwargs)
        start = self._cache_arguments(inputs, kwargs)
        if start is not None:
            inputs, query = self._span_inputs(inputs, kwargs["cache_position"], start), (query - start).clamp(min=0)
        fixed = self._head_rows(query, start, inputs.shape[1])
        if self.pass_logits_to_keep:
            kwargs["logits_to_keep"] = query if fixed is None else fixed
        logits = self._forward(inputs, kwargs)
        if fixed is not None:
            return self._combine(take_rows(logits, fixed, query))
        if not self.pass_logits_to_keep or logits.shape[1] != query.shape[-1]:
            if query.dim() == 2:
                logits = logits.gather(1, query[..., None].expand(-1, -1, logits.shape[-1]))
            else:
                logits = logits[:, query]
        return self._combine(logits)

    def logits_at(self, rows: Rows, positions: torch.Tensor) -> torch.Tensor:
        """Logits (B, K, V) predicting the tokens at per-row positions ``positions`` (B, K): asked as such of models
        that take per-row positions, else computed at the union of the columns and gathered."""
        if self.per_row_logits:
            return self.logits(rows, positions)
        columns, index = torch.unique(positions, return_inverse=True)
        logits = self.logits(rows, columns)
        return logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1]))

    def _block_arguments(self, mask: Optional[torch.Tensor], kwargs: dict[str, Any]) -> None:
        """A block-causal model's attention block and, for padded rows, positions counted from each row's first
        token (so the blocks of a padded row are those it has alone)."""
        if not self.block_causal:
            return
        if self.pass_block_size:
            kwargs["block_size"] = self.block_size
        if mask is not None:
            kwargs["position_ids"] = (mask.long().cumsum(1) - 1).clamp(min=0)

    def _hide_columns(self, inputs: torch.Tensor, mask: Optional[torch.Tensor], kwargs: dict[str, Any]) -> None:
        """With ``hidden_from``: the columns from there on leave the attention mask (they are still computed as
        queries); the positions stay those of the canvas (counted from each row's first token, padding aside)."""
        if self.hidden_from is None or self.hidden_from >= inputs.shape[1]:
            return
        if mask is None:
            mask = torch.ones(inputs.shape, dtype=torch.bool, device=inputs.device)
        kwargs.setdefault("position_ids", (mask.long().cumsum(1) - 1).clamp(min=0))
        seen = torch.arange(inputs.shape[1], device=inputs.device) < self.hidden_from
        kwargs["attention_mask"] = mask.bool() & seen

    def _head_rows(self, query: torch.Tensor, start: Optional[int], length: int) -> Optional[torch.Tensor]:
        """Under static shapes, the fixed rows the LM head runs over (`head_rows`: the block's, ``block_length``
        of them) of an input of ``length`` columns from canvas column ``start``; else None (``query`` itself)."""
        if not self.static_shapes or not self.pass_logits_to_keep or self.columns is None:
            return None
        width = max(self.block_length, self.columns[1] - self.columns[0])
        return head_rows(self.columns, width, query, self.shift, (start or 0, length))

    def _span_inputs(self, inputs: torch.Tensor, columns: torch.Tensor, start: int) -> torch.Tensor:
        """The input ids of a span forward: the canvas columns ``columns`` (from ``start``; under static shapes
        padded with copies of the last, `fixed_width`)."""
        if self.static_shapes:
            return inputs[:, columns]
        return inputs[:, start : start + columns.numel()]

    def _span_columns(self, start: int, end: int, device: torch.device) -> torch.Tensor:
        """The canvas columns [start, end) of a span forward; under static shapes padded to the widest span of the
        call (the prefix cache's first: spans shrink as blocks advance; the exact cache's: two blocks), so that every
        span forward has one shape."""
        columns = torch.arange(start, end, device=device)
        if not self.static_shapes:
            return columns
        widest = 2 * (self.block.end - self.block.start) + self.shift if self.exact is not None else 0
        self.span_width = max(self.span_width, columns.numel(), widest)  # exact cache: a block and the one before
        return fixed_width(columns, self.span_width)

    def _cache_arguments(self, inputs: torch.Tensor, kwargs: dict[str, Any]) -> Optional[int]:
        """Adds the cache arguments of this forward to ``kwargs``: a full forward that keeps keys/values at a
        refresh, else the span against the cache. Returns the span's first column (None for a full forward)."""
        block = self.block
        if block is None:
            return None
        if self.exact is not None:
            return self._exact_cache_arguments(inputs, kwargs)
        refresh = block.cache is None or (
            self.kv_cache_refresh is not None and block.forwards % self.kv_cache_refresh == 0
        )
        block.forwards += 1
        if refresh:
            block.cache = None
            self._refresh(kwargs)
            return None
        start = max(block.start - self.shift, 0)
        if block.span is None:
            end = inputs.shape[1] if self.kv_cache == "prefix" else block.end
            block.span = self._span_columns(start, end, inputs.device)
        kwargs.update(cache=block.cache, cache_position=block.span)
        return start

    def _exact_cache_arguments(self, inputs: torch.Tensor, kwargs: dict[str, Any]) -> Optional[int]:
        """The exact block cache: a full forward when there is no cache of these rows (or at a refresh), else the
        columns from the first whose keys/values are not final to the block's end."""
        block, exact = self.block, self.exact
        refresh = self.kv_cache_refresh is not None and block.forwards % self.kv_cache_refresh == 0
        block.forwards += 1
        if exact.cache is None or exact.rows != inputs.shape[0] or refresh:
            exact.cache, exact.rows, exact.final = None, inputs.shape[0], block.start
            self._refresh(kwargs)
            return None
        start = max(min(exact.final, block.start) - self.shift, 0)
        exact.final = block.start  # every block before this one is complete: this forward makes it final
        kwargs.update(cache=exact.cache, cache_position=self._span_columns(start, block.end, inputs.device))
        return start

    def full_logits(
        self, x: torch.Tensor, prompt_mask: torch.Tensor, model_kwargs: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """Logits (B, L, V) of the whole canvas as the reference samplers compute them: the LM head on every
        position (no ``logits_to_keep``, so the logits are the reference's bit for bit), guidance, then the shift
        (the logits at j are those predicting position j); on the canvas' device."""
        inputs, kwargs = x, model_kwargs
        if self.guided:
            inputs = torch.cat([x, x.masked_fill(prompt_mask, self.mask_id)])
            kwargs = {name: torch.cat([value, value]) for name, value in model_kwargs.items()}
        return shift_logits(self._combine(self._forward(inputs, kwargs)), self.shift).to(x.device)

    def _refresh(self, kwargs: dict[str, Any]) -> None:
        """A full forward that keeps every layer's keys/values in a new cache (with ``static_cache``, then copied into
        the call's fixed buffers: `_forward`)."""
        kwargs["use_cache"] = True

    def _forward(self, inputs: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        output = (self.forward or self.model)(inputs, **kwargs)
        if kwargs.get("use_cache"):
            cache = output_cache(output)
            if self.static_cache:
                cache = self.static = static_copy(cache, self.static)
            if self.exact is not None:
                self.exact.cache = cache
            else:
                self.block.cache = cache
        self.nfe += 2 if self.guided else 1
        self.forward_rows += inputs.shape[0]
        self.forward_tokens += inputs.shape[0] * inputs.shape[1]
        return output.logits

    def _combine(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.guided:
            return logits
        cond, uncond = logits.chunk(2)
        return classifier_free_guidance(cond, uncond, self.cfg_scale)
