"""``hf-mdm serve`` against calling ``generate`` directly: what the server itself costs, and what its schedulers give.
Part of ``make bench`` (-> ``evaluation/SERVE.md``).

Setting: a random MDM (hidden 256, 4 layers, the tiny byte-level tokenizer's vocabulary of 259), float32, on the CPU;
prompts of 4-12 words, 32 new tokens in blocks of 8, 32 steps, temperature 0. The server runs in this process on a
free loopback port (`hf_mdm.serve.running`); clients are threads of another process, with the standard library's
HTTP.

- Throughput with the prefix cache, for the micro-batcher and for joining at the next forward
  (`hf_mdm.serve.joining`): 16 concurrent clients x 2 requests of 32 tokens, and 64 clients x 3 requests of 8, 16
  or 32 tokens; completion tokens per second against the same requests through `Engine.run` directly (``generate``
  plus padding and decoding, one process, no HTTP), in batches of up to 16 requests with one config, in arrival
  order. Target: the server >= 0.9x.
- Latency of one request at a time (one client): median over ``--repeats`` requests, against the same request's
  direct call. Target: <= 1.1x.
- Two mixed short/long traces, on the bidirectional MDM (the LLaDA 1 / Dream case) and on the same MDM made
  block-causal (the LLaDA2 case, each request with its exact block cache), every request streamed: p50 / p99
  latency, the short requests' median and the time to the first streamed chunk, one request at a time, the
  micro-batcher and joining. Targets: bidirectional, joining's p99 and short median each >= 2x better than the
  micro-batcher's; block-causal burst, the long requests' p99 <= 1.0x the micro-batcher's while the short requests'
  median is <= 0.1x of it.

Rounds interleave the server and the direct calls; medians over ``--repeats``.

    python evaluation/bench_serve.py [--repeats 3] [--threads 1] [--output FILE.md] [--quick]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_measure import parse_table_arguments, print_and_write  # noqa: E402

from hf_mdm import MDMConfig, MDMForMaskedDiffusion  # noqa: E402
from hf_mdm.harness.tiny import build_tokenizer  # noqa: E402
from hf_mdm.serve import Engine, ServeSettings, build_app, running  # noqa: E402
from hf_mdm.serve.protocol import parse_request  # noqa: E402

CLIENTS = 16
SCHEDULERS = (("one request at a time", "one"), ("micro-batcher", "micro-batch"), ("joining", "join"))


def engine_of(args: argparse.Namespace, scheduler: str, block_causal: bool = False) -> Engine:
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    sizes = dict(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=4)
    if block_causal:
        sizes["block_size"] = args.block
    config = MDMConfig(vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id, intermediate_size=4 * args.hidden,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **sizes)  # fmt: skip
    settings = ServeSettings(max_batch=CLIENTS, max_wait_ms=args.wait_ms, max_queue=1024, scheduler=scheduler,
                             max_cache_tokens=1 << 20)  # fmt: skip
    return Engine(MDMForMaskedDiffusion(config).eval(), tokenizer, settings)


def prompts(args: argparse.Namespace, count: int) -> list[str]:
    generator = torch.Generator().manual_seed(1)
    words = "the of and a to in is you that it he was for on are as with his they at be this have from".split()
    out = []
    for _ in range(count):
        n = int(torch.randint(4, 12, (), generator=generator))
        out.append(" ".join(words[int(i)] for i in torch.randint(0, len(words), (n,), generator=generator)))
    return out


def body(args: argparse.Namespace, prompt: str, stream: bool = False, tokens: Any = None, **extra: Any) -> dict:
    tokens = tokens or args.new
    return {"prompt": prompt, "max_tokens": tokens, "steps": tokens, "block_length": args.block, "temperature": 0,
            "stream": stream, **extra}  # fmt: skip


def post(url: str, payload: dict) -> tuple[float, float, int]:
    """(seconds to the answer, seconds to the first streamed chunk or the answer, completion tokens)."""
    request = urllib.request.Request(
        url + "/v1/completions", json.dumps(payload).encode(), {"Content-Type": "application/json"}
    )
    start, first, text = time.perf_counter(), None, b""
    with urllib.request.urlopen(request, timeout=600) as answer:
        for line in answer:
            text += line
            if first is None and line.startswith(b"data:"):
                first = time.perf_counter() - start
    total = time.perf_counter() - start
    usage = json.loads(text)["usage"]["completion_tokens"] if not payload.get("stream") else 0
    return total, first if first is not None else total, usage


def burst(url: str, payloads: list[list[dict]]) -> tuple[float, list[tuple[float, float, int]]]:
    """Each client's payloads one after the other, the clients at once, from a process of their own (so that the
    clients' Python does not share the server's interpreter lock): (wall seconds, every request's timings)."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_burst_here, (url, payloads))


def _burst_here(url: str, payloads: list[list[dict]]) -> tuple[float, list[tuple[float, float, int]]]:
    start = time.perf_counter()
    with ThreadPoolExecutor(len(payloads)) as pool:
        per_client = list(pool.map(lambda mine: [post(url, p) for p in mine], payloads))
    return time.perf_counter() - start, [t for client in per_client for t in client]


def direct(engine: Engine, payloads: list[dict]) -> tuple[float, int]:
    """The requests through `Engine.run` directly, in batches of up to ``CLIENTS`` with one config in arrival order:
    (seconds, completion tokens)."""
    jobs = [engine.prepare(parse_request(dict(p, stream=False), chat=False)) for p in payloads]
    batches: dict[str, list] = {}
    for job in jobs:
        batches.setdefault(job.key, []).append(job)
    start, tokens = time.perf_counter(), 0
    for same in batches.values():
        for i in range(0, len(same), CLIENTS):
            tokens += sum(answer.completion_tokens for answer in engine.run(same[i : i + CLIENTS]))
    return time.perf_counter() - start, tokens


def throughput(args: argparse.Namespace, scheduler: str, clients: int, per_client: int, mixed_lengths: bool) -> dict:
    """Served completion tokens/s at ``clients`` concurrent clients (prefix cache), against the same requests
    through `Engine.run`; rounds interleaved."""
    engine = engine_of(args, scheduler)
    texts = prompts(args, clients * per_client)
    lengths = [args.new // 4, args.new // 2, args.new] if mixed_lengths else [args.new]
    flat = [body(args, t, tokens=lengths[i % len(lengths)], kv_cache="prefix") for i, t in enumerate(texts)]
    payloads = [flat[c * per_client : (c + 1) * per_client] for c in range(clients)]
    served, baseline = [], []
    with running(build_app(engine, engine.settings, "bench")) as url:
        burst(url, payloads[:2])  # warm-up
        direct(engine, flat[:4])
        for _ in range(args.repeats):
            seconds, timings = burst(url, payloads)
            served.append(sum(t[2] for t in timings) / seconds)
            seconds, tokens = direct(engine, flat)
            baseline.append(tokens / seconds)
    s, d = statistics.median(served), statistics.median(baseline)
    return dict(served=s, direct=d, ratio=s / d)


def throughput_rows(args: argparse.Namespace) -> list[dict]:
    rows = []
    shapes = ((CLIENTS, args.requests_per_client, False), (args.many, 3, True))
    for clients, per_client, mixed_lengths in shapes:
        for name, scheduler in SCHEDULERS[1:]:
            row = throughput(args, scheduler, clients, per_client, mixed_lengths)
            what = f"{clients} clients x {per_client} requests" + (" of mixed lengths" if mixed_lengths else "")
            rows.append(dict(row, name=name, what=what))
    return rows


def single_latency(args: argparse.Namespace) -> dict:
    engine = engine_of(args, "one")
    text = prompts(args, 1)[0]
    job = engine.prepare(parse_request(body(args, text), chat=False))
    served, baseline = [], []
    with running(build_app(engine, engine.settings, "bench")) as url:
        post(url, body(args, text))  # warm-up
        engine.run([job])
        for _ in range(args.repeats):
            served.append(post(url, body(args, text))[0])
            start = time.perf_counter()
            engine.run([type(job)(job.ids, job.config, job.key, job.seed, job.stops, job.max_tokens)])
            baseline.append(time.perf_counter() - start)
    s, d = statistics.median(served), statistics.median(baseline)
    return dict(served_s=s, direct_s=d, ratio=s / d)


def trace_rows(args: argparse.Namespace, block_causal: bool) -> dict[str, list[dict]]:
    """Two mixed traces, every request streamed, through each scheduler (a block-causal model's requests with
    their exact block cache):

    - ``burst``: 4 long requests (``long`` tokens) at once, then 12 short ones (``block`` tokens) every 50 ms. A
      quarter of the requests are long, so the p99 is a long request's latency;
    - ``stream``: ``stream`` short requests, one every ``gap_ms``, and one long request among them (the 11th). The
      p99 is then the short requests' tail: how long the requests that queue behind the long one wait."""
    texts = prompts(args, max(16, args.stream))
    extra = {"kv_cache": "prefix"} if block_causal else {}

    def request(text: str, tokens: int) -> dict:
        return body(args, text, stream=True, tokens=tokens, **extra)

    burst_jobs = [(request(t, args.long), 0.0, "long") for t in texts[:4]]
    burst_jobs += [(request(t, args.block), 0.05 * (i + 1), "short") for i, t in enumerate(texts[4:16])]
    stream_jobs = [(request(t, args.long if i == 10 else args.block), i * args.gap_ms / 1000,
                    "long" if i == 10 else "short") for i, t in enumerate(texts[: args.stream])]  # fmt: skip
    rows: dict[str, list[dict]] = {"burst": [], "stream": []}
    for name, scheduler in SCHEDULERS:
        engine = engine_of(args, scheduler, block_causal=block_causal)
        timings: dict[str, list] = {"burst": [], "stream": []}
        with running(build_app(engine, engine.settings, "bench")) as url:
            post(url, burst_jobs[-1][0])  # warm-up
            for _ in range(args.repeats):
                timings["burst"] += mixed(url, burst_jobs)
                timings["stream"] += mixed(url, stream_jobs)
        for trace in rows:
            rows[trace].append(dict(name=name, **percentiles(timings[trace])))
    return rows


def mixed(url: str, jobs: list[tuple[dict, float, str]]) -> list[tuple[float, float, str]]:
    """Each (payload, seconds after the start, kind) sent at its time: (latency, first chunk, kind) each."""

    def send(payload: dict, delay: float, kind: str) -> tuple[float, float, str]:
        time.sleep(delay)
        return (*post(url, payload)[:2], kind)

    with ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(lambda job: send(*job), jobs))


def percentiles(timings: list[tuple[float, float, str]]) -> dict:
    latencies = sorted(t[0] for t in timings)
    p99 = latencies[min(len(latencies) - 1, int(round(0.99 * (len(latencies) - 1))))]
    kinds = {kind: [t[0] for t in timings if t[2] == kind] for kind in ("short", "long")}
    return dict(p50=statistics.median(latencies), p99=p99, first=statistics.median(t[1] for t in timings),
                short=statistics.median(kinds["short"]), long_p99=max(kinds["long"]))  # fmt: skip


def verdict(ok: bool) -> str:
    return "met" if ok else "not met"


def markdown(args: argparse.Namespace, tp: list[dict], single: dict, traces: dict[str, dict]) -> str:
    lines = [
        "# hf-mdm serve against generate called directly",
        "",
        f"Written by `evaluation/bench_serve.py` (`make bench`): random MDM of hidden {args.hidden}, {args.layers} "
        f"layers, float32, CPU, {torch.get_num_threads()} thread(s); {args.new} new tokens in blocks of {args.block}, "
        f"as many steps as tokens, temperature 0; loopback HTTP; medians over {args.repeats} rounds.",
        "",
        "| measure | served | direct | ratio | target |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in tp:
        lines.append(
            f"| throughput, {row['name']}, {row['what']}, prefix cache, completion tokens/s | {row['served']:.1f} | "
            f"{row['direct']:.1f} | {row['ratio']:.2f}x | >= 0.9x ({verdict(row['ratio'] >= 0.9)}) |"
        )
    lines.append(
        f"| one request at a time, latency s | {single['served_s']:.3f} | {single['direct_s']:.3f} | "
        f"{single['ratio']:.2f}x | <= 1.1x ({verdict(single['ratio'] <= 1.1)}) |"
    )
    for title, trace in traces.items():
        lines += trace_tables(args, title, trace)
    return "\n".join(lines) + "\n"


HEADER = [
    "",
    "| scheduler | p50 latency s | p99 latency s | short requests' median latency s | long requests' slowest s | "
    "median time to first chunk s |",
    "| --- | --- | --- | --- | --- | --- |",
]


def _row(r: dict) -> str:
    return (
        f"| {r['name']} | {r['p50']:.3f} | {r['p99']:.3f} | {r['short']:.3f} | {r['long_p99']:.3f} | {r['first']:.3f} |"
    )


def _better(micro: float, join: float) -> str:
    """How joining's latency compares with the micro-batcher's: "2.00x better" or "1.50x worse"."""
    return f"{micro / join:.2f}x better" if micro >= join else f"{join / micro:.2f}x worse"


def trace_tables(args: argparse.Namespace, title: str, trace: dict[str, list[dict]]) -> list[str]:
    burst, stream = trace["burst"], trace["stream"]
    micro, join = stream[1], stream[2]
    lines = [
        "",
        f"## {title}",
        "",
        f"A stream: {args.stream} short requests of {args.block} tokens, one every {args.gap_ms:.0f} ms, and one long "
        f"request of {args.long} tokens among them (the 11th); every request streamed; {args.repeats} rounds.",
        *HEADER,
        *map(_row, stream),
        "",
        f"Joining against the micro-batcher: p99 {join['p99']:.3f} s against {micro['p99']:.3f} s "
        f"({_better(micro['p99'], join['p99'])}), short requests' median {join['short']:.3f} s against "
        f"{micro['short']:.3f} s ({_better(micro['short'], join['short'])}).",
        "",
        f"A burst: 4 long requests of {args.long} tokens at once, then 12 short ones of {args.block} tokens every "
        "50 ms (a quarter of the requests are long: the p99 is a long request's).",
        *HEADER,
        *map(_row, burst),
        "",
        f"Joining against the micro-batcher: the long requests' slowest {burst[2]['long_p99']:.3f} s against "
        f"{burst[1]['long_p99']:.3f} s ({burst[2]['long_p99'] / burst[1]['long_p99']:.2f}x), the short requests' "
        f"median {burst[2]['short']:.3f} s against {burst[1]['short']:.3f} s "
        f"({burst[2]['short'] / burst[1]['short']:.2f}x).",
    ]
    return lines


def parse(argv: Any = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests-per-client", type=int, default=2)
    p.add_argument("--wait-ms", type=float, default=20.0)
    p.add_argument("--gap-ms", type=float, default=80.0, help="the stream trace's time between requests")
    sizes = dict(hidden=256, layers=4, new=32, block=8, long=256, stream=100, many=64)
    quick = dict(hidden=32, layers=1, new=8, block=4, long=16, stream=20, many=8)
    return parse_table_arguments(p, argv, 3, sizes, quick)


def main(argv: Any = None) -> str:
    args = parse(argv)
    tp, single = throughput_rows(args), single_latency(args)
    traces = {"A bidirectional MDM (the LLaDA 1 / Dream case)": trace_rows(args, block_causal=False),
              f"The MDM made block-causal, blocks of {args.block} (the LLaDA2 case), exact block cache":
              trace_rows(args, block_causal=True)}  # fmt: skip
    return print_and_write(markdown(args, tp, single, traces), args.output)


if __name__ == "__main__":
    main()
