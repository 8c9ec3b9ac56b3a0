"""The comparison's outputs, rendered from its rows (`hf_mdm.harness.compare.collect_rows`): the CSV, the Markdown
table and the accuracy-against-time plot."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Sequence

CSV_FIELDS = [
    "benchmark",
    "task",
    "model",
    "setting",
    "metric",
    "accuracy",
    "stderr",
    "time_s",
    "summed_s",
    "generate_s",
    "requests",
    "nfe_per_request",
    "tokens_per_s",
    "paper_accuracy",
    "paper_time_s",
    "limit",
]


def csv_text(rows: Sequence[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(config: Any, rows: Sequence[dict], paper_numbers: Path) -> str:
    header = [
        "benchmark",
        "model",
        "setting",
        "accuracy (%)",
        "time (s)",
        "requests",
        "NFE / request",
        "tokens / s",
        "paper accuracy (%)",
        "paper time (s)",
    ]
    lines = [
        f"# {config.name}: accuracy against time",
        "",
        "Time: the run's wall-clock seconds (device synchronised; with several processes the slowest one's); the "
        "paper's time is for the whole benchmark"
        + (", ours for `limit` requests." if any(r["limit"] for r in rows) else "."),
        "Paper: " + json.loads(paper_numbers.read_text(encoding="utf-8"))["source"],
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] * 3 + ["---:"] * (len(header) - 3)) + "|",
    ]
    for r in rows:
        cells = [
            r["benchmark"],
            r["model"],
            r["setting"],
            _fmt(r["accuracy"]),
            _fmt(r["time_s"]),
            _fmt(r["requests"]),
            _fmt(r["nfe_per_request"]),
            _fmt(r["tokens_per_s"]),
            _fmt(r["paper_accuracy"]),
            _fmt(r["paper_time_s"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(config: Any, rows: Sequence[dict]) -> bytes:
    """Accuracy against time per benchmark, one colour per model (filled: ours, hollow: the paper's); each point
    carries the number of its setting, and the numbers are keyed under the panel (names beside the points overlap)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    benchmarks = sorted({r["benchmark"] for r in rows}) or ["(no finished cells)"]
    numbers = {
        b: {s: i + 1 for i, s in enumerate(dict.fromkeys(r["setting"] for r in rows if r["benchmark"] == b))}
        for b in benchmarks
    }
    key_lines = max(len(n) for n in numbers.values())
    figure, axes = plt.subplots(
        1, len(benchmarks), figsize=(5.5 * len(benchmarks), 4.2 + 0.16 * key_lines), squeeze=False
    )
    colors = {}
    palette = plt.get_cmap("tab10")
    for axis, benchmark in zip(axes[0], benchmarks):
        subset, number = [r for r in rows if r["benchmark"] == benchmark], numbers[benchmark]
        for model in dict.fromkeys(r["model"] for r in subset):
            color = colors.setdefault(model, palette(len(colors) % 10))
            points = sorted(
                (r for r in subset if r["model"] == model and r["accuracy"] is not None), key=lambda r: r["time_s"]
            )
            _series(axis, [(r["time_s"], r["accuracy"], number[r["setting"]]) for r in points], color, model, True)
            published = sorted((r for r in points if r["paper_accuracy"] is not None), key=lambda r: r["paper_time_s"])
            paper = [(r["paper_time_s"], r["paper_accuracy"], number[r["setting"]]) for r in published]
            _series(axis, paper, color, f"{model} (paper)", filled=False)
        axis.set_title(benchmark)
        axis.set_xlabel("time for the benchmark (s)")
        axis.set_ylabel("accuracy (%)")
        if any(r["time_s"] > 0 for r in subset):
            axis.set_xscale("log")
            axis.xaxis.set_minor_locator(matplotlib.ticker.LogLocator(subs=(2.0, 3.0, 5.0)))  # labels that fit
            axis.xaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_ylim(-2, 102)
        axis.grid(True, alpha=0.3)
        if subset:
            axis.legend(fontsize=7)
    figure.suptitle(
        f"{config.name}: accuracy vs time\n(filled: ours, hollow: the paper; numbers: settings)", fontsize=9
    )
    bottom = 0.16 * key_lines / (4.2 + 0.16 * key_lines)
    figure.tight_layout(rect=(0, bottom, 1, 1))
    for axis, benchmark in zip(axes[0], benchmarks):  # each panel's settings keyed under it
        key = "\n".join(f"{i}: {setting}" for setting, i in numbers[benchmark].items())
        figure.text(axis.get_position().x0, 0.01, key, fontsize=6, va="bottom", family="monospace")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120)
    plt.close(figure)
    return buffer.getvalue()


def _series(axis: Any, points: Sequence[tuple], color: Any, label: str, filled: bool) -> None:
    if not points:
        return
    xs, ys, names = zip(*points)
    axis.plot(xs, ys, linestyle="-" if filled else "--", color=color, alpha=0.8)
    axis.scatter(xs, ys, color=color if filled else "none", edgecolors=color, label=label, zorder=3)
    for x, y, number in points:
        axis.annotate(str(number), (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")


# -- command line --------------------------------------------------------------------------------------------------
