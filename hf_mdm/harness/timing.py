"""Per-request timing of lm-eval requests, and its totals in lm-eval's results.

Every batch the harness runs is timed with the device synchronised before and after (``torch.cuda.synchronize``
on CUDA), from the tokenisation of its prompts to the decoded texts. A batch's wall-clock time, its model time
(the ``generate()`` call itself; for masked diffusion models the sampler's own ``elapsed_s``) and its forward
passes (NFE) are split evenly among its requests; generated tokens are counted per request with the prompt
excluded:

- ``generated_tokens``: tokens the model produced for the request: for an autoregressive model up to and
  including its EOS or the token that completed a stop string (what it generated before stopping); for a masked
  diffusion model every token of its canvas up to and including EOS (what the sampler denoised);
- ``output_tokens``: tokens of the answer as returned to lm-eval, i.e. up to the first stop string.

`summarize` adds these up per task; `attach_timing` writes the totals into lm-eval's results dict (``results
["timing"]`` and, for the printed table, ``results["results"][task]["<name>,timing"]``) and the per-request
values into the samples log (``sample["timing"]``), so that accuracy and time come from one run.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Optional, Sequence

from ..timer import Stopwatch, synchronize

__all__ = ["RequestTiming", "TimingRecorder", "RequestTag", "summarize", "attach_timing", "synchronize", "Stopwatch"]

TABLE_FIELDS = ("wall_s", "generate_s", "nfe", "generated_tokens", "tokens_per_s", "requests")


@dataclass(frozen=True)
class RequestTag:
    """Which request a measurement belongs to: lm-eval's task, doc id, repeat, and whether it is a padding copy
    (lm-eval pads the ranks of a multi-process run to equal length by re-running a request)."""

    task: str
    doc_id: int
    request_type: str
    repeat: int = 0
    padding: bool = False


@dataclass
class RequestTiming:
    """Timing of one request (see the module docstring for the counting rules)."""

    task: str
    doc_id: int
    request_type: str
    repeat: int
    padding: bool
    rank: int
    batch_size: int
    time_s: float
    batch_time_s: float
    generate_s: float
    nfe: float
    generated_tokens: int
    output_tokens: int
    from_cache: bool = False  # answered from the request cache of a resumed run; the values are those it ran with

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.time_s if self.time_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tokens_per_s"] = self.tokens_per_s
        return out


def tag_requests(requests: Sequence[Any]) -> list[RequestTag]:
    """Tags of lm-eval ``Instance``s: the n-th occurrence of an instance is its repeat n; occurrences beyond its
    ``repeats`` are the padding lm-eval adds to balance ranks."""
    seen: Counter = Counter()
    tags = []
    for request in requests:
        key = id(request)
        repeat = seen[key]
        seen[key] += 1
        tags.append(
            RequestTag(
                task=str(getattr(request, "task_name", None) or "unknown"),
                doc_id=int(getattr(request, "doc_id", None) or 0),
                request_type=str(getattr(request, "request_type", None) or "unknown"),
                repeat=repeat,
                padding=repeat >= int(getattr(request, "repeats", None) or 1),
            )
        )
    return tags


class TimingRecorder:
    """Collects `RequestTiming` records of one process."""

    def __init__(self, rank: int = 0):
        self.rank = rank
        self.records: list[RequestTiming] = []

    def add_batch(
        self,
        tags: Sequence[RequestTag],
        batch_time_s: float,
        generate_s: float,
        nfe: float,
        generated_tokens: Sequence[int],
        output_tokens: Sequence[int],
    ) -> None:
        """Record one batch: its time and forward passes are split evenly among its requests."""
        size = len(tags)
        for tag, generated, output in zip(tags, generated_tokens, output_tokens):
            self.records.append(
                RequestTiming(
                    task=tag.task,
                    doc_id=tag.doc_id,
                    request_type=tag.request_type,
                    repeat=tag.repeat,
                    padding=tag.padding,
                    rank=self.rank,
                    batch_size=size,
                    time_s=batch_time_s / size,
                    batch_time_s=batch_time_s,
                    generate_s=generate_s / size,
                    nfe=nfe / size,
                    generated_tokens=int(generated),
                    output_tokens=int(output),
                )
            )

    def add_request(self, tag: RequestTag, time_s: float, generate_s: float, nfe: float) -> None:
        """Record one scored request (loglikelihood): no generated tokens."""
        self.records.append(
            RequestTiming(tag.task, tag.doc_id, tag.request_type, tag.repeat, tag.padding, self.rank, 1,
                          time_s, time_s, generate_s, nfe, 0, 0)  # fmt: skip
        )

    def restore(self, tag: RequestTag, stored: dict[str, Any]) -> None:
        """Record a request answered from the request cache with the timing stored when it ran
        (`hf_mdm.harness.resume`); the tag (task, doc, repeat, rank) is this run's."""
        fields = ("batch_size", "time_s", "batch_time_s", "generate_s", "nfe", "generated_tokens", "output_tokens")
        self.records.append(
            RequestTiming(tag.task, tag.doc_id, tag.request_type, tag.repeat, tag.padding, self.rank,
                          **{name: stored[name] for name in fields}, from_cache=True)  # fmt: skip
        )

    def clear(self) -> None:
        self.records.clear()


def summarize(records: Iterable[RequestTiming]) -> dict[str, Any]:
    """Totals of records (padding copies excluded, except in the per-rank time):

    ``requests``, ``wall_s`` (harness seconds summed over processes: a single-device run's benchmark time),
    ``generate_s`` (model seconds), ``nfe``, ``generated_tokens``, ``output_tokens``, ``tokens_per_s``
    (generated_tokens / wall_s), ``seconds_per_request``, ``nfe_per_request``, ``elapsed_s`` (the slowest
    process's seconds: the wall-clock of a multi-process run), ``ranks`` and ``cached_requests`` (answered from the
    request cache of a resumed run, with the timing they were measured with).
    """
    records = list(records)
    counted = [r for r in records if not r.padding]
    per_rank: dict[int, float] = defaultdict(float)
    for record in records:
        per_rank[record.rank] += record.time_s
    wall = sum(r.time_s for r in counted)
    requests = len(counted)
    generated = sum(r.generated_tokens for r in counted)
    return {
        "requests": requests,
        "wall_s": wall,
        "generate_s": sum(r.generate_s for r in counted),
        "nfe": sum(r.nfe for r in counted),
        "generated_tokens": generated,
        "output_tokens": sum(r.output_tokens for r in counted),
        "tokens_per_s": generated / wall if wall > 0 else 0.0,
        "seconds_per_request": wall / requests if requests else 0.0,
        "nfe_per_request": sum(r.nfe for r in counted) / requests if requests else 0.0,
        "elapsed_s": max(per_rank.values(), default=0.0),
        "ranks": len(per_rank),
        "padding_requests": len(records) - len(counted),
        "cached_requests": sum(r.from_cache for r in counted),
    }


def attach_timing(
    results: dict[str, Any], records: Sequence[RequestTiming], samples: Optional[dict[str, Sequence[int]]] = None
) -> dict[str, Any]:
    """Write timing into lm-eval's results dict (in place; also returned).

    Args:
        results: what ``lm_eval.simple_evaluate`` returned on rank 0.
        records: the records of every process.
        samples: the ``samples`` argument of the run (task -> doc indices), to map doc ids as lm-eval logs them.
    """
    by_task: dict[str, list[RequestTiming]] = defaultdict(list)
    for record in records:
        by_task[record.task].append(record)
    results["timing"] = {
        "all": summarize(records),
        "tasks": {task: summarize(task_records) for task, task_records in sorted(by_task.items())},
        "unit": "seconds of wall-clock, device synchronised; nfe = forward passes",
    }
    for task, totals in results["timing"]["tasks"].items():
        if task in results.get("results", {}):
            for name in TABLE_FIELDS:
                results["results"][task][f"{name},timing"] = totals[name]
    _attach_to_samples(results.get("samples") or {}, by_task, samples or {})
    return results


def _attach_to_samples(
    logged: dict[str, list[dict]], by_task: dict[str, list[RequestTiming]], indices: dict[str, Sequence[int]]
) -> None:
    for task, task_samples in logged.items():
        per_doc: dict[int, list[dict]] = defaultdict(list)
        mapping = indices.get(task)
        for record in by_task.get(task, []):
            if not record.padding:
                doc_id = mapping[record.doc_id] if mapping is not None else record.doc_id
                per_doc[doc_id].append(record.to_dict())
        for sample in task_samples:
            sample["timing"] = sorted(per_doc.get(sample.get("doc_id"), []), key=lambda r: r["repeat"])
