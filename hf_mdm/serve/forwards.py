"""Continuous batching at the model call: concurrent ``generate`` calls share their forwards.

Each joined request runs its own ``generate`` call, alone, in a thread of its own (`hf_mdm.serve.joining`), with
its own canvas, block plan, key/value cache and random draws. Its model forwards go through `SharedForwards`: a
forward waits until every running call has asked for its next one, then the waiting forwards run as batched forwards
(the last call to ask runs them, so no thread sits idle in between) and each call gets its own rows of the output.
So a request joins the running ones at their next forward and leaves after its last; a call of any sampler, family
or cache kind joins (no per-sampler rules), and a client that left stops at its next forward (`RowLeft`).

Forwards run as one batch only when they have one shape: the same input width, the same keyword arguments, the same
columns asked of the LM head and of the cache. Then no row is padded, and a row's arithmetic is its own: on devices
whose kernels do not choose their reduction order by the number of rows (`hf_mdm.generation_rows
.batches_invariantly`: the CPU in float32) every answer is bit for bit that of its ``generate`` call alone,
whatever joins or leaves and whenever it arrives. Elsewhere the batched forward equals the row's own up to the last
bits, and ``batched=False`` (the server's ``--batch-invariant``) runs each forward alone. Forwards of other shapes
(another prompt length, a refresh beside a cached step) run in the same round as batches of their own.

Keys/values kept across steps (`hf_mdm.kv_cache`) stay each call's own: the caches of a batch are concatenated
for its forward, and each call's cache then views its rows of the result (a span forward writes its fresh keys and
values in place). A batched forward that raises is retried one call at a time, so only the faulty call fails.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
from transformers import Cache

__all__ = ["SharedForwards", "RowLeft"]

SMALL = 4096  # a tensor argument shared by the rows (columns asked) is compared by value up to this size
COLUMNS = "logits_to_keep"  # the columns asked of the LM head: (K,) for every row, or (B, K) per row
ROWS = frozenset({"input_ids", "inputs_embeds", "attention_mask", "position_ids"})  # (B, ...): one row each


class RowLeft(Exception):
    """Raised in a call's thread at its next forward once its client left: the call ends there."""


@dataclass
class _Call:
    args: tuple
    kwargs: dict
    key: tuple
    rows: int
    since: int  # the member's registration order: older calls' forwards run first in a round
    output: Any = None
    error: Optional[BaseException] = None
    done: bool = False

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.output


class SharedForwards:
    """Runs the forwards of ``model`` asked at the same time by member threads as batched forwards (see the module
    docstring). ``lock`` is held around each round of forwards (the engine's: other calls on the model wait);
    ``on_forward(rows, calls)`` observes each forward run."""

    def __init__(
        self, model: Any, batched: bool = True, lock: Any = None, on_forward: Optional[Callable] = None
    ) -> None:
        self.model, self.batched, self.on_forward = model, batched, on_forward
        self._lock = lock if lock is not None else contextlib.nullcontext()
        self._cond = threading.Condition()
        self._members = self._registered = 0
        self._pending: list[_Call] = []
        self._leading = False
        self._local = threading.local()
        original = model.forward

        @functools.wraps(original)
        def forward(*args: Any, **kwargs: Any) -> Any:
            if self.routes():
                return self._call(args, kwargs)
            return original(*args, **kwargs)

        model.forward = forward  # the model's own forward, through the rounds for member threads

    def routes(self) -> bool:
        """Whether a forward asked in this thread goes through the rounds (a member's, not while it runs a round)."""
        return getattr(self._local, "left", None) is not None and not getattr(self._local, "leading", False)

    @contextlib.contextmanager
    def member(self, left: Callable[[], bool] = lambda: False) -> Iterator[None]:
        """The calling thread's forwards join the rounds while the block runs; ``left()`` true makes the next one
        raise `RowLeft`."""
        with self._cond:
            self._members += 1
            self._registered += 1
            self._local.since = self._registered
        self._local.left, self._local.leading = left, False
        try:
            yield
        finally:
            self._local.left = None
            with self._cond:
                self._members -= 1
                self._cond.notify_all()

    def _call(self, args: tuple, kwargs: dict) -> Any:
        if self._local.left():
            raise RowLeft("the client left")
        call = _Call(args, kwargs, _key(args, kwargs), _rows(args, kwargs), self._local.since)
        with self._cond:
            self._pending.append(call)
            self._cond.notify_all()
            while not call.done:
                if not self._leading and len(self._pending) >= self._members:
                    batch, self._pending, self._leading = self._pending, [], True
                    break
                self._cond.wait(0.5)
            else:
                return call.result()
        try:
            self._local.leading = True
            with self._lock:
                self._round(batch)
        finally:
            self._local.leading = False
            with self._cond:
                self._leading = False
                self._cond.notify_all()
        return call.result()

    def _round(self, batch: list[_Call]) -> None:
        """Every waiting forward: calls of one shape as one batched forward (retried alone if it raises), the group
        of the oldest member first (the requests that have waited longest go on first)."""
        groups: dict[tuple, list[_Call]] = {}
        for call in sorted(batch, key=lambda call: call.since):
            groups.setdefault(call.key if self.batched else (id(call),), []).append(call)
        for calls in groups.values():
            if len(calls) > 1:
                with contextlib.suppress(Exception):
                    self._run(calls)
            for call in calls:
                if not call.done:
                    try:
                        self._run([call])
                    except BaseException as err:  # the call's own failure, raised in its thread
                        with self._cond:
                            call.error, call.done = err, True
                            self._cond.notify_all()

    def _run(self, calls: list[_Call]) -> None:
        if len(calls) == 1:
            call = calls[0]
            call.output = self.model(*call.args, **call.kwargs)
        else:
            args, kwargs = _merged(calls)
            output = self.model(*args, **kwargs)
            start = 0
            for call in calls:
                rows = slice(start, start + call.rows)
                call.output = _own_columns(_rows_of(output, rows), call.kwargs.get(COLUMNS), kwargs.get(COLUMNS))
                for name, value in call.kwargs.items():
                    if isinstance(value, Cache):  # the span forward wrote into the merged cache: view its rows
                        _view(value, kwargs[name], rows)
                start += call.rows
        if self.on_forward is not None:
            self.on_forward(sum(call.rows for call in calls), len(calls))
        with self._cond:  # these calls go on (their host work beside the round's next forwards)
            for call in calls:
                call.done = True
            self._cond.notify_all()


def _batched(name: Optional[str], value: torch.Tensor) -> bool:
    """Whether a tensor argument has a row per input row: positional inputs, ids, masks, positions, and per-row
    columns of the LM head (``logits_to_keep`` (B, K))."""
    return name is None or name in ROWS or (name == COLUMNS and value.dim() == 2)


def _describe(name: Optional[str], value: Any) -> tuple:
    """What must be equal for two calls' ``value`` to run in one forward."""
    if isinstance(value, torch.Tensor):
        if name == COLUMNS and value.dim() == 1:  # merged: the union of the calls' columns
            return ("columns", value.dtype, str(value.device))
        if _batched(name, value):
            return ("rows", tuple(value.shape[1:]), value.dtype, str(value.device))
        if value.numel() > SMALL:
            return ("object", id(value))
        return ("same", tuple(value.shape), value.dtype, str(value.device), tuple(value.flatten().tolist()))
    if isinstance(value, Cache):
        return ("cache", tuple((tuple(layer.keys.shape[1:]), layer.keys.dtype) for layer in value.layers))
    if value is None or isinstance(value, (bool, int, float, str)):
        return ("value", value)
    return ("object", id(value))  # anything else: only with itself


def _key(args: tuple, kwargs: dict) -> tuple:
    return tuple(_describe(None, a) for a in args) + tuple(
        (name, _describe(name, kwargs[name])) for name in sorted(kwargs)
    )


def _rows(args: tuple, kwargs: dict) -> int:
    first = args[0] if args else kwargs.get("input_ids", kwargs.get("inputs_embeds"))
    return int(first.shape[0])


def _merged(calls: list[_Call]) -> tuple[tuple, dict]:
    """The batched forward's arguments: rows concatenated, caches merged, the rest the first call's (equal)."""
    args = tuple(torch.cat([call.args[i] for call in calls]) for i in range(len(calls[0].args)))
    kwargs = {}
    for name, value in calls[0].kwargs.items():
        if name == COLUMNS and isinstance(value, torch.Tensor) and value.dim() == 1:
            kwargs[name] = torch.unique(torch.cat([call.kwargs[name] for call in calls]))
        elif isinstance(value, torch.Tensor) and _batched(name, value):
            kwargs[name] = torch.cat([call.kwargs[name] for call in calls])
        elif isinstance(value, Cache):
            kwargs[name] = _merged_cache([call.kwargs[name] for call in calls])
        else:
            kwargs[name] = value
    return args, kwargs


def _merged_cache(caches: list[Any]) -> Any:
    merged = copy.copy(caches[0])
    merged.layers = []
    for layers in zip(*(cache.layers for cache in caches)):
        layer = copy.copy(layers[0])
        layer.keys = torch.cat([one.keys for one in layers])
        layer.values = torch.cat([one.values for one in layers])
        merged.layers.append(layer)
    return merged


def _view(cache: Any, merged: Any, rows: slice) -> None:
    """``cache``'s keys/values become its rows of ``merged`` (views: no copy)."""
    for layer, whole in zip(cache.layers, merged.layers):
        layer.keys, layer.values = whole.keys[rows], whole.values[rows]


def _own_columns(part: Any, own: Any, union: Any) -> Any:
    """A call's logits at its own LM-head columns ``own`` (K,), of the ``union`` the batched forward asked (when
    the model kept only those: else every column, as the call gets alone)."""
    if not isinstance(own, torch.Tensor) or own.dim() != 1 or part.logits.shape[1] != union.numel():
        return part
    if not torch.equal(own, union):
        part["logits"] = part.logits[:, torch.searchsorted(union, own)]
    return part


def _rows_of(output: Any, rows: slice) -> Any:
    """A call's part of a batched output: its rows of every tensor, of every cache and of tuples of tensors."""
    fields = {}
    for name, value in output.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            fields[name] = value[rows]
        elif isinstance(value, Cache):
            part = copy.copy(value)
            part.layers = [copy.copy(layer) for layer in value.layers]
            _view(part, value, rows)
            fields[name] = part
        elif isinstance(value, tuple):
            fields[name] = tuple(v[rows] if isinstance(v, torch.Tensor) else v for v in value)
        else:
            fields[name] = value
    return type(output)(**fields)
