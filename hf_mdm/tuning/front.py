"""The answer of ``hf-mdm tune``: the Pareto front of quality against tokens/s, and the setting chosen on it.

A row is on the front when no other row is at least as good on both axes and better on one (point estimates: the
median round's tokens/s, the quality measured on the development split); rows a halving search dropped are never on
it (another setting beat them with confidence). The chosen row is the fastest on the front whose quality is within
``tolerance`` of the best quality measured (absolute, in the quality's own unit), or the one ``objective`` scores
highest when given.
"""

from __future__ import annotations

from typing import Callable, Optional


def pareto_front(rows: list[dict]) -> list[dict]:
    """The rows no other row dominates (quality and tokens/s, higher better), by increasing tokens/s."""
    alive = [r for r in rows if r.get("dropped_after") is None]
    front = [r for r in alive if not any(_beats(other, r) for other in alive if other is not r)]
    return sorted(front, key=lambda r: r["tokens_per_s"])


def _beats(a: dict, b: dict) -> bool:
    at_least = a["quality"] >= b["quality"] and a["tokens_per_s"] >= b["tokens_per_s"]
    return at_least and (a["quality"] > b["quality"] or a["tokens_per_s"] > b["tokens_per_s"])


def choose(front: list[dict], tolerance: float = 0.02, objective: Optional[Callable[[dict], float]] = None) -> dict:
    """The fastest row of ``front`` whose quality is within ``tolerance`` of the best, or ``objective``'s best."""
    if not front:
        raise ValueError("the front is empty: no setting was measured")
    if objective is not None:
        return max(front, key=objective)
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    best = max(r["quality"] for r in front)
    return max((r for r in front if r["quality"] >= best - tolerance), key=lambda r: r["tokens_per_s"])
