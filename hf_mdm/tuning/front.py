"""The answer of ``hf-mdm tune``: the Pareto front of quality against tokens/s, and the setting chosen on it.

Speeds are compared only where the timing resolves them (`resolved`: the ranges of enough interleaved rounds do not
overlap); speeds it does not tell apart count as equal. A row is on the front when no other row is at least as good
on both axes and better on one (quality: the point estimate on the development split); rows a halving search
dropped are never on it (another setting beat them with confidence). Among the front's rows whose quality is within
``tolerance`` of the best (absolute, in the quality's own unit), the chosen row is the fastest, or, where the timing
does not resolve the fastest's speed from others', the cheapest of those (fewest forwards per token, then fewest
positions computed per token, then the higher quality, then the earlier in the space): a speed difference inside
the timing noise would change from run to run. ``objective``, when given, picks the front's row it scores highest.
"""

from __future__ import annotations

from typing import Callable, Optional

from .space import setting_key

#: Fewest timed rounds whose ranges can resolve two speeds: equal speeds give disjoint ranges of n rounds each with
#: chance 2 / C(2n, n), 1 at one round, 1/3 at two, 1/10 at three, 1/35 at four, 1/126 at five.
RESOLVING_ROUNDS = 4


def resolved(fast: dict, slow: dict, rounds: int) -> bool:
    """Whether ``fast`` is faster than ``slow`` beyond the timing noise: at least `RESOLVING_ROUNDS` rounds, and
    ``fast``'s slowest round faster than ``slow``'s fastest (a row without a range: its median)."""
    low = fast.get("tokens_per_s_min", fast["tokens_per_s"])
    return rounds >= RESOLVING_ROUNDS and low > slow.get("tokens_per_s_max", slow["tokens_per_s"])


def pareto_front(rows: list[dict], rounds: int = 5) -> list[dict]:
    """The rows no other row beats (quality, and tokens/s where ``rounds`` resolve them), by increasing tokens/s."""
    alive = [r for r in rows if r.get("dropped_after") is None]
    front = [r for r in alive if not any(_beats(other, r, rounds) for other in alive if other is not r)]
    return sorted(front, key=lambda r: r["tokens_per_s"])


def _beats(a: dict, b: dict, rounds: int) -> bool:
    if a["quality"] < b["quality"] or resolved(b, a, rounds):
        return False
    return a["quality"] > b["quality"] or resolved(a, b, rounds)


def contenders(front: list[dict], tolerance: float, rounds: int) -> tuple[dict, list[dict], list[dict]]:
    """The fastest row of ``front`` within ``tolerance`` of the best quality, the rows within it, and those of them
    whose speed the fastest's does not resolve (itself included)."""
    if not front:
        raise ValueError("the front is empty: no setting was measured")
    best = max(r["quality"] for r in front)
    near = [r for r in front if r["quality"] >= best - tolerance]
    fastest = max(near, key=lambda r: r["tokens_per_s"])
    return fastest, near, [r for r in near if r is fastest or not resolved(fastest, r, rounds)]


def choose(
    rows: list[dict],
    tolerance: float = 0.02,
    objective: Optional[Callable[[dict], float]] = None,
    rounds: int = 5,
    front: Optional[list[dict]] = None,
) -> dict:
    """The chosen row of ``rows``' front (see the module docstring; ``rounds``: the timed rounds behind the
    speeds; ``front``: `pareto_front` of ``rows`` where the caller has it)."""
    front = pareto_front(rows, rounds) if front is None else front
    if objective is not None:
        if not front:
            raise ValueError("the front is empty: no setting was measured")
        return max(front, key=objective)
    check_tolerance(tolerance)
    _, _, tied = contenders(front, tolerance, rounds)
    order = {id(r): i for i, r in enumerate(rows)}
    return min(tied, key=lambda r: (r["nfe_per_token"], r["positions_per_token"], -r["quality"], order[id(r)]))


def check_tolerance(tolerance: float) -> None:
    if not tolerance >= 0:  # NaN too
        raise ValueError(f"--tolerance must be >= 0 (quality the chosen setting may give up), got {tolerance}")


def choice_note(front: list[dict], chosen: dict, tolerance: float, rounds: int) -> str:
    """One sentence: why ``chosen`` (the fastest, resolved from the rest; or the cheapest of unresolved speeds)."""
    fastest, near, tied = contenders(front, tolerance, rounds)
    if len(near) == 1:
        return "It is the only setting on the front within the tolerance."
    if len(tied) == 1:
        return (
            f"Its speed is resolved from every other setting within the tolerance ({rounds} rounds, disjoint ranges)."
        )
    why = (
        f"fewer than {RESOLVING_ROUNDS} rounds resolve none"
        if rounds < RESOLVING_ROUNDS
        else "ranges of rounds overlap"
    )
    note = (
        f"{len(tied)} settings within the tolerance run at speeds that {rounds} timed round{'s' * (rounds != 1)} "
        f"cannot tell apart from the fastest's ({why}): the cheapest of them is chosen (fewest forwards per token, "
        "then positions computed per token; at equal costs the higher quality, then the earlier in the space)"
    )
    if chosen is not fastest:
        note += f" over the fastest by its median, `{setting_key(fastest['setting'])}`"
    return note + "."
