"""Per-request timing of lm-eval requests, and its totals in lm-eval's results.

Every batch the harness runs is timed with the device synchronised before and after (``torch.cuda.synchronize``
on CUDA), from the tokenisation of its prompts to the decoded texts. A batch's wall-clock time and its model time
(the ``generate()`` call itself; for masked diffusion models the sampler's own ``elapsed_s``) are split evenly
among its requests. A request's NFE is the number of sequential forward passes of its batch (every row of the
batch is in each of them), so it does not depend on the batch size; the batch's rows x forwards is its own field.
Generated tokens are counted per request with the prompt excluded:

- ``generated_tokens``: tokens the model produced for the request: for an autoregressive model up to and
  including its EOS or the token that completed a stop string (what it generated before stopping); for a masked
  diffusion model every token of its canvas up to and including EOS (what the sampler denoised);
- ``output_tokens``: tokens of the answer as returned to lm-eval, i.e. up to the first stop string.

`summarize` adds these up per task; the run's wall-clock is the slowest process's time, not a sum over processes
(`SUMMARY_FIELDS` and `REQUEST_FIELDS` say what each field means, and travel with the results). `attach_timing`
writes the totals into lm-eval's results dict (``results["timing"]`` and, for the printed table,
``results["results"][task]["<name>,timing"]``) and the per-request values into the samples log
(``sample["timing"]``), so that accuracy and time come from one run.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Optional, Sequence, Union

from ..timer import Stopwatch, synchronize

__all__ = [
    "RequestTiming",
    "TimingRecorder",
    "RequestTag",
    "summarize",
    "attach_timing",
    "synchronize",
    "Stopwatch",
    "SUMMARY_FIELDS",
    "REQUEST_FIELDS",
]

TABLE_FIELDS = ("wall_s", "generate_s", "nfe", "nfe_per_request", "generated_tokens", "tokens_per_s", "requests")
SUMMARY_FIELDS = {
    "requests": "requests evaluated (lm-eval's padding copies, which balance the processes, excluded)",
    "wall_s": "the run's wall-clock seconds: the slowest process's seconds (= summed_s with one process)",
    "rank_s": "each process's seconds, by rank: the sum of its batches' wall-clock, device synchronised at both "
    "ends of every batch (padding copies included: the process spent that time)",
    "summed_s": "the requests' seconds summed over processes (the compute time of the requests)",
    "generate_s": "model seconds (the generate() call alone) summed over requests and processes",
    "nfe": "per-request NFE summed over requests",
    "nfe_per_request": "mean per-request NFE: the sequential forward passes a request took part in (see the "
    "request fields); does not depend on the batch size",
    "forward_rows": "rows x forward passes summed over batches: the sequences the network computed",
    "forward_tokens": "positions the network computed, summed (rows x input length of every forward pass; with a "
    "KV cache a forward covers only its span, so fewer than forward_rows x the canvas length)",
    "generated_tokens": "tokens the model generated, prompt excluded, summed over requests",
    "output_tokens": "tokens of the answers returned to lm-eval (up to the first stop string), summed",
    "tokens_per_s": "generated_tokens / wall_s: the run's throughput",
    "seconds_per_request": "summed_s / requests: a request's share of the compute time",
    "ranks": "processes that evaluated requests",
    "padding_requests": "padding copies lm-eval ran to balance the processes (timed, not counted)",
    "cached_requests": "requests answered from the request cache of a resumed run (with the timing they ran with)",
}
REQUEST_FIELDS = {
    "time_s": "the request's share of its batch's wall-clock (batch_time_s / batch_size)",
    "batch_time_s": "wall-clock of the request's batch, device synchronised",
    "generate_s": "the request's share of the batch's model seconds",
    "nfe": "sequential forward passes of the request's batch, every row in each (classifier-free guidance counts "
    "two; rows that finished early skip the batch's later blocks); for loglikelihood requests the masked "
    "copies scored (mc_num)",
    "batch_forward_rows": "rows x forward passes of the request's batch",
    "forward_tokens": "the request's share of the positions its batch's forward passes computed",
    "batch_size": "requests in the batch",
    "rank": "the process that evaluated the request",
    "generated_tokens": "tokens the model generated for the request (prompt excluded; through EOS)",
    "output_tokens": "tokens of the answer returned to lm-eval (up to the first stop string)",
    "tokens_per_s": "generated_tokens / time_s",
    "from_cache": "answered from the request cache of a resumed run; its values are those it ran with",
}


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
    forward_tokens: float = 0.0  # positions the network computed for this request (its share of rows x span)
    batch_forward_rows: float = 0.0
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
        nfe: Union[float, Sequence[float]],
        generated_tokens: Sequence[int],
        output_tokens: Sequence[int],
        forward_tokens: float = 0.0,
    ) -> None:
        """Record one batch: its times are split evenly among its requests; each request took part in its ``nfe``
        sequential forward passes (one number: the batch's, which every row took part in; one per row: the rows
        ran alone, each in its own), and its share of the positions they computed is ``forward_tokens`` / size."""
        size = len(tags)
        per_row = list(nfe) if isinstance(nfe, (list, tuple)) else [nfe] * size
        rows = sum(per_row) if isinstance(nfe, (list, tuple)) else nfe * size
        for tag, generated, output, row_nfe in zip(tags, generated_tokens, output_tokens, per_row):
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
                    nfe=row_nfe,
                    generated_tokens=int(generated),
                    output_tokens=int(output),
                    forward_tokens=forward_tokens / size,
                    batch_forward_rows=rows,
                )
            )

    def add_request(self, tag: RequestTag, time_s: float, generate_s: float, nfe: float) -> None:
        """Record one scored request (loglikelihood): no generated tokens."""
        self.records.append(
            RequestTiming(
                tag.task,
                tag.doc_id,
                tag.request_type,
                tag.repeat,
                tag.padding,
                self.rank,
                1,
                time_s,
                time_s,
                generate_s,
                nfe,
                0,
                0,
                batch_forward_rows=nfe,
            )
        )

    def restore(self, tag: RequestTag, stored: dict[str, Any]) -> None:
        """Record a request answered from the request cache with the timing stored when it ran
        (`hf_mdm.harness.resume`); the tag (task, doc, repeat, rank) is this run's."""
        fields = ("batch_size", "time_s", "batch_time_s", "generate_s", "nfe", "generated_tokens", "output_tokens")
        measured = {name: stored[name] for name in ("forward_tokens", "batch_forward_rows") if name in stored}
        self.records.append(
            RequestTiming(
                tag.task,
                tag.doc_id,
                tag.request_type,
                tag.repeat,
                tag.padding,
                self.rank,
                **{name: stored[name] for name in fields},
                **measured,
                from_cache=True,
            )
        )

    def clear(self) -> None:
        self.records.clear()


def summarize(records: Iterable[RequestTiming]) -> dict[str, Any]:
    """Totals of records, the fields of `SUMMARY_FIELDS` (padding copies excluded, except in the processes'
    seconds)."""
    records = list(records)
    counted = [r for r in records if not r.padding]
    per_rank: dict[int, float] = defaultdict(float)
    for record in records:
        per_rank[record.rank] += record.time_s
    rank_s = [per_rank[rank] for rank in sorted(per_rank)]
    wall, summed = max(rank_s, default=0.0), sum(r.time_s for r in counted)
    requests, generated, nfe = len(counted), sum(r.generated_tokens for r in counted), sum(r.nfe for r in counted)
    return {
        "requests": requests,
        "wall_s": wall,
        "rank_s": rank_s,
        "summed_s": summed,
        "generate_s": sum(r.generate_s for r in counted),
        "nfe": nfe,
        "nfe_per_request": nfe / requests if requests else 0.0,
        "forward_rows": sum(r.batch_forward_rows / r.batch_size for r in counted),
        "generated_tokens": generated,
        "output_tokens": sum(r.output_tokens for r in counted),
        "forward_tokens": sum(r.forward_tokens for r in counted),
        "tokens_per_s": generated / wall if wall > 0 else 0.0,
        "seconds_per_request": summed / requests if requests else 0.0,
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
        "fields": SUMMARY_FIELDS,
        "request_fields": REQUEST_FIELDS,
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
