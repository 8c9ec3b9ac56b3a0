"""Counting host synchronisations: the tensor operations whose result the host must wait for.

On an accelerator, reading a tensor's value on the host (``.item()``, ``int(t)``, ``bool(t)``, ``.tolist()``) or
running an operation whose output shape depends on the values (``nonzero``, boolean indexing, ``unique``,
``bincount``, ...) stops the host until the device has caught up, so the host can no longer queue work ahead of it
and a compiled or graph-captured step breaks there. `count_host_syncs` counts those operations as they are called,
on any device (a CPU run counts the ones a GPU run would wait on), with a `TorchDispatchMode` for the operators and a
`TorchFunctionMode` for the reads a tensor method makes (``Tensor.tolist``, and under ``torch.inference_mode``
``.item()``, ``int(t)``, ``bool(t)``, which read a CPU tensor without dispatching any operator); a read counted there
is not counted again by the operator it dispatches.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# operators whose output shape (or a Python value) depends on the data
_DATA_DEPENDENT = frozenset(
    {
        "aten::_local_scalar_dense",  # .item(), int(t), float(t), bool(t)
        "aten::nonzero",
        "aten::masked_select",
        "aten::_unique2",
        "aten::unique_dim",
        "aten::unique_consecutive",
        "aten::bincount",
    }
)
_BOOL_INDEXED = frozenset({"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"})


def _has_bool_index(args: tuple) -> bool:
    indices = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)


class HostSyncCounter(TorchDispatchMode):
    """Counts, by operator name, the calls that synchronise the host (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_op: Counter[str] = Counter()
        self.reading = False  # inside a read the function mode counted (its operator is not counted again)

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        name = func._schema.name
        if name == "aten::_local_scalar_dense" and self.reading:
            pass
        elif name in _DATA_DEPENDENT or (name in _BOOL_INDEXED and _has_bool_index(args)):
            self.by_op[name.removeprefix("aten::")] += 1
        elif name == "aten::repeat_interleave" and func._overloadname != "self_int":
            self.by_op["repeat_interleave"] += int((kwargs or {}).get("output_size") is None)  # repeats as a tensor
        return func(*args, **(kwargs or {}))


# tensor methods that read a value on the host, and the operator each is counted as
_READS = {
    "tolist": "tolist",
    **dict.fromkeys(("item", "__int__", "__bool__", "__float__", "__index__"), "_local_scalar_dense"),
}


class _ReadCounter(TorchFunctionMode):
    def __init__(self, counter: HostSyncCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        read = _READS.get(getattr(func, "__name__", None))
        if read is None or self.counter.reading:
            return func(*args, **(kwargs or {}))
        self.counter.by_op[read] += 1
        self.counter.reading = True
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.counter.reading = False


@contextmanager
def count_host_syncs() -> Iterator[HostSyncCounter]:
    """``with count_host_syncs() as syncs: ...``, then ``syncs.total`` and ``syncs.by_op`` (operator -> calls)."""
    counter = HostSyncCounter()
    with _ReadCounter(counter), counter:
        yield counter
