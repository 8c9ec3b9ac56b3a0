"""The arithmetic of `evaluation/bench.py`: what one timed call measures, rounds of interleaved calls, the ideal cache
speed-ups from positions computed, the targets of issue 22 and the table.

- `ForwardMeter`: forward hooks on a model that time every ``model.forward`` inside a call (device synchronised,
  `hf_mdm.timer.synchronize`, with ``time.perf_counter`` at both ends) and count the positions each forward computes
  (rows x input length);
- `interleave`: rounds that call every run once in turn after untimed warm-up rounds, each call timed as a whole
  (`hf_mdm.timer.Stopwatch`) with the meter's forward time and positions of the same call;
- `cache_positions`: the positions per row the denoiser computes with and without a cache, derived by hand from
  `hf_mdm.generation_denoiser` (checked against the meter in ``tests/test_bench.py``);
- `count_syncs`: the host synchronisations of one call (`hf_mdm.host_syncs`), in an untimed call of its own (the
  counting slows every operation);
- `Target`: a threshold and its verdict; `format_table`: the one table.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from hf_mdm.host_syncs import count_host_syncs
from hf_mdm.timer import Stopwatch, synchronize

__all__ = [
    "ForwardMeter",
    "Call",
    "Series",
    "interleave",
    "count_syncs",
    "cache_positions",
    "outside_share",
    "Target",
    "format_table",
]


class ForwardMeter:
    """Times each forward of ``model`` and counts the positions it computes, while attached (``with meter:``)."""

    def __init__(self, model: torch.nn.Module, device: Any = "cpu"):
        self.model, self.device = model, device
        self.seconds, self.forwards, self.positions = 0.0, 0, 0
        self.lengths: list[int] = []
        self._start: Optional[float] = None
        self._handles: list[Any] = []

    def reset(self) -> None:
        self.seconds, self.forwards, self.positions, self.lengths = 0.0, 0, 0, []

    def _before(self, module: Any, args: tuple, kwargs: dict) -> None:
        ids = args[0] if args else kwargs.get("input_ids", kwargs.get("decoder_input_ids"))
        if ids is None:
            raise ValueError(
                "ForwardMeter counts positions from input_ids (or decoder_input_ids): the forward got none"
            )
        self.positions += ids.shape[0] * ids.shape[1]
        self.lengths.append(int(ids.shape[1]))
        synchronize(self.device)
        self._start = time.perf_counter()

    def _after(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        synchronize(self.device)
        self.seconds += time.perf_counter() - self._start
        self.forwards += 1

    def __enter__(self) -> "ForwardMeter":
        self.reset()
        self._handles = [
            self.model.register_forward_pre_hook(self._before, with_kwargs=True),
            self.model.register_forward_hook(self._after, with_kwargs=True),
        ]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


@dataclass
class Call:
    """One timed call: its wall seconds, the seconds inside the model's forwards, forwards run, positions computed."""

    seconds: float
    forward_seconds: float
    forwards: int
    positions: int


@dataclass
class Series:
    """The timed calls of one run (warm-up left out)."""

    calls: list[Call] = field(default_factory=list)
    syncs: Optional[int] = None  # host synchronisations of one call (`count_syncs`), when counted

    @property
    def median(self) -> float:
        return statistics.median(c.seconds for c in self.calls)

    @property
    def min(self) -> float:
        return min(c.seconds for c in self.calls)

    @property
    def forward_median(self) -> float:
        return statistics.median(c.forward_seconds for c in self.calls)

    @property
    def outside_share(self) -> float:
        """The median over calls of each call's share of time outside the forwards."""
        return statistics.median(outside_share(c.seconds, c.forward_seconds) for c in self.calls)


def outside_share(total: float, inside: float) -> float:
    """The share of ``total`` seconds spent outside the ``inside`` seconds of the forwards in it."""
    if total <= 0 or inside < 0 or inside > total:
        raise ValueError(f"need 0 <= inside <= total and total > 0, got inside={inside}, total={total}")
    return (total - inside) / total


def interleave(
    runs: dict[str, tuple[torch.nn.Module, Callable[[], Any]]],
    repeats: int,
    warmup: int = 1,
    device: Any = "cpu",
    progress: Optional[Callable[[str], None]] = None,
) -> dict[str, Series]:
    """Each run (its model, a call) called once per round, in turn, ``warmup`` untimed rounds then ``repeats``
    timed ones; every call timed as a whole and its model's forwards metered in the same call. ``progress`` gets a
    line before each round."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    series = {name: Series() for name in runs}
    for round_ in range(warmup + repeats):
        if progress is not None:
            kind = "warm-up" if round_ < warmup else "timed"
            progress(f"round {round_ + 1} of {warmup + repeats} ({kind})")
        for name, (model, fn) in runs.items():
            with ForwardMeter(model, device) as meter, Stopwatch(device) as watch:
                fn()
            if round_ >= warmup:
                series[name].calls.append(Call(watch.seconds, meter.seconds, meter.forwards, meter.positions))
    return series


def count_syncs(fn: Callable[[], Any]) -> int:
    """The host synchronisations of one untimed call of ``fn`` (`hf_mdm.host_syncs.count_host_syncs`)."""
    with count_host_syncs() as syncs:
        fn()
    return syncs.total


def cache_positions(cache: Optional[str], prompt: int, new: int, block: int, steps: int) -> int:
    """Positions per row the denoiser computes for ``new`` tokens after ``prompt`` in blocks of ``block``, ``steps``
    forwards in all (``steps / blocks`` a block), canvas L = prompt + new, no guidance, no logits shift:

    - None: every forward the canvas: steps x L;
    - "prefix" (bidirectional): a block's first forward the canvas, its others from the block's start to the end:
      per block j (0-based) L + (s - 1)(new - j block), in all k L + (s - 1) block k (k + 1) / 2;
    - "dual" (bidirectional): a block's first forward the canvas, its others the block: k L + k (s - 1) block;
    - "exact" (block-causal, ``kv_cache`` set): the canvas once, then every forward the block, and a block's first
      forward also the block before it: L + (s - 1) block + (k - 1)(s + 1) block.
    """
    if new % block or steps % (new // block):
        raise ValueError(f"need blocks of {block} to divide {new} new tokens and the blocks to divide {steps} steps")
    length, k = prompt + new, new // block
    s = steps // k
    if cache is None:
        return steps * length
    if cache == "prefix":
        return k * length + (s - 1) * block * k * (k + 1) // 2
    if cache == "dual":
        return k * length + k * (s - 1) * block
    if cache == "exact":
        return length + (s - 1) * block + (k - 1) * (s + 1) * block
    raise ValueError(f"unknown cache {cache!r}: use None, 'prefix', 'dual' or 'exact'")


@dataclass
class Target:
    """A target of issue 22 item 3: ``value`` compared with ``bound`` (``at_most`` or at least)."""

    name: str
    value: float
    bound: float
    at_most: bool
    judged: bool = True  # False: printed for information (not the size the targets are judged at)

    @property
    def holds(self) -> bool:
        return self.value <= self.bound if self.at_most else self.value >= self.bound

    @property
    def verdict(self) -> str:
        passed = "PASS" if self.holds else "FAIL"
        return passed if self.judged else f"({passed}, not judged)"

    def describe(self) -> str:
        return f"{self.name} {'<=' if self.at_most else '>='} {self.bound:g}"


HEADER = (
    "row",
    "B",
    "generate s min/med",
    "forward s med",
    "outside",
    "NFE",
    "host syncs / NFE",
    "positions",
    "measured",
    "target",
    "",
)


def format_table(rows: list[dict]) -> str:
    """A markdown table: each row's ``name``, ``batch``, optional ``series`` (timings), ``measured`` text and
    optional ``target`` (a `Target`; a row without one is information)."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for row in rows:
        s: Optional[Series] = row.get("series")
        timing = ("", "", "", "", "", "")
        if s is not None:
            forwards = s.calls[0].forwards
            timing = (
                f"{s.min:.3f} / {s.median:.3f}",
                f"{s.forward_median:.3f}",
                f"{100 * s.outside_share:.1f}%",
                str(forwards),
                "" if s.syncs is None or not forwards else f"{s.syncs / forwards:.2f}",
                str(s.calls[0].positions),
            )
        target: Optional[Target] = row.get("target")
        judged = (target.describe(), target.verdict) if target is not None else ("-", "information")
        cells = (row["name"], str(row["batch"]), *timing, row["measured"], *judged)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_table_arguments(parser: Any, argv: Any, repeats: int, sizes: dict, quick: dict) -> Any:
    """The arguments of the table benchmarks (bench_invariance, bench_lm_head): ``--repeats``, ``--threads`` (set
    here), ``--output``, ``--quick`` (``quick`` over ``sizes``, one round); ``sizes`` become attributes."""
    parser.add_argument("--repeats", type=int, default=repeats, help="timed rounds (medians over them)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1 on a shared machine)")
    parser.add_argument("--output", default=None, help="also write the table here (Markdown, atomically)")
    parser.add_argument("--quick", action="store_true", help="a tiny model, one round: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        sizes, args.repeats = {**sizes, **quick}, 1
    for name, value in sizes.items():
        setattr(args, name, value)
    torch.set_num_threads(args.threads)
    return args


def print_and_write(text: str, output: Optional[str]) -> str:
    """Print a benchmark's Markdown and write it to ``output`` when given (whole or not at all)."""
    from hf_mdm.fileio import write_atomic

    print(text)
    if output:
        write_atomic(output, text)
    return text
