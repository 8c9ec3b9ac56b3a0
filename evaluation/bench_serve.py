"""``hf-mdm serve`` against calling ``generate`` directly: what the server itself costs, and what batching gives.
Part of ``make bench`` (-> ``evaluation/SERVE.md``).

Setting: a random MDM (hidden 256, 4 layers, the tiny byte-level tokenizer's vocabulary of 259), float32, on the CPU;
prompts of 20-60 characters, 32 new tokens in blocks of 8, 32 steps, temperature 0. The server runs in this process
on a free loopback port (`hf_mdm.serve.running`); clients are threads of another process, with the standard
library's HTTP.

- Throughput at 16 concurrent clients (each sends ``--requests-per-client`` requests one after the other): the
  micro-batcher's requests per second, against the same requests in the same batches (the batches the server
  formed, recorded and replayed) through `Engine.run`, the call ``generate`` plus padding and decoding, in one
  process with no HTTP. Target: the server >= 0.9x (its own cost under 10%).
- Latency of one request at a time (one client): median over ``--repeats`` requests, against the same request's
  direct call. Target: <= 1.1x.
- Two mixed short/long traces on the same MDM made block-causal (`trace_rows`): p50 / p99 latency, the short
  requests' median and the time to the first streamed chunk, one request at a time (``max_batch=1``), the
  micro-batcher and joining running batches at block boundaries (`hf_mdm.serve.joining`). Target: joining's p99
  below the micro-batcher's on the stream (short requests with a long one among them).

Rounds interleave the server and the direct replay; medians over ``--repeats``.

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


def engine_of(args: argparse.Namespace, max_batch: int, block_causal: bool = False, join: bool = True) -> Engine:
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    sizes = dict(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=4)
    if block_causal:
        sizes["block_size"] = args.block
    config = MDMConfig(vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id, intermediate_size=4 * args.hidden,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **sizes)  # fmt: skip
    settings = ServeSettings(max_batch=max_batch, max_wait_ms=args.wait_ms, max_queue=1024, join_at_blocks=join)
    return Engine(MDMForMaskedDiffusion(config).eval(), tokenizer, settings)


def prompts(args: argparse.Namespace, count: int) -> list[str]:
    generator = torch.Generator().manual_seed(1)
    words = "the of and a to in is you that it he was for on are as with his they at be this have from".split()
    out = []
    for _ in range(count):
        n = int(torch.randint(4, 12, (), generator=generator))
        out.append(" ".join(words[int(i)] for i in torch.randint(0, len(words), (n,), generator=generator)))
    return out


def body(args: argparse.Namespace, prompt: str, stream: bool = False) -> dict:
    return {"prompt": prompt, "max_tokens": args.new, "steps": args.new, "block_length": args.block, "temperature": 0,
            "stream": stream}  # fmt: skip


def post(url: str, payload: dict) -> tuple[float, float]:
    """(seconds to the answer, seconds to the first streamed chunk or the answer)."""
    request = urllib.request.Request(
        url + "/v1/completions", json.dumps(payload).encode(), {"Content-Type": "application/json"}
    )
    start, first = time.perf_counter(), None
    with urllib.request.urlopen(request, timeout=600) as answer:
        for line in answer:
            if first is None and line.startswith(b"data:"):
                first = time.perf_counter() - start
    total = time.perf_counter() - start
    return total, first if first is not None else total


def burst(url: str, payloads: list[list[dict]]) -> tuple[float, list[tuple[float, float]]]:
    """Each client's payloads one after the other, the clients at once, from a process of their own (so that the
    clients' Python does not share the server's interpreter lock): (wall seconds, every request's timings)."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_burst_here, (url, payloads))


def _burst_here(url: str, payloads: list[list[dict]]) -> tuple[float, list[tuple[float, float]]]:
    start = time.perf_counter()
    with ThreadPoolExecutor(len(payloads)) as pool:
        per_client = list(pool.map(lambda mine: [post(url, p) for p in mine], payloads))
    return time.perf_counter() - start, [t for client in per_client for t in client]


def replay(engine: Engine, batches: list[list[Any]]) -> float:
    """The recorded batches through `Engine.run` directly (fresh jobs, same prompts and configs): seconds."""
    start = time.perf_counter()
    for jobs in batches:
        engine.run([type(job)(job.ids, job.config, job.key, job.seed, job.stops, job.max_tokens) for job in jobs])
    return time.perf_counter() - start


def throughput(args: argparse.Namespace) -> dict:
    engine = engine_of(args, max_batch=CLIENTS)
    texts = prompts(args, CLIENTS * args.requests_per_client)
    payloads = [[body(args, texts[c * args.requests_per_client + i]) for i in range(args.requests_per_client)]
                for c in range(CLIENTS)]  # fmt: skip
    served, direct, sizes = [], [], []
    with running(build_app(engine, engine.settings, "bench")) as url:
        burst(url, payloads[:2])  # warm-up
        for _ in range(args.repeats):
            engine.batches = []
            seconds, _ = burst(url, payloads)
            batches, engine.batches = engine.batches, None
            served.append(seconds)
            direct.append(replay(engine, batches))
            sizes += [len(b) for b in batches]
    n = CLIENTS * args.requests_per_client
    s, d = statistics.median(served), statistics.median(direct)
    return dict(served_rps=n / s, direct_rps=n / d, ratio=d / s, mean_batch=statistics.mean(sizes))


def single_latency(args: argparse.Namespace) -> dict:
    engine = engine_of(args, max_batch=1)
    text = prompts(args, 1)[0]
    job = engine.prepare(
        parse_request({"prompt": text, **{k: v for k, v in body(args, text).items() if k != "prompt"}}, chat=False)
    )
    served, direct = [], []
    with running(build_app(engine, engine.settings, "bench")) as url:
        post(url, body(args, text))  # warm-up
        engine.run([job])
        for _ in range(args.repeats):
            served.append(post(url, body(args, text))[0])
            start = time.perf_counter()
            engine.run([type(job)(job.ids, job.config, job.key, job.seed, job.stops, job.max_tokens)])
            direct.append(time.perf_counter() - start)
    s, d = statistics.median(served), statistics.median(direct)
    return dict(served_s=s, direct_s=d, ratio=s / d)


SCHEDULERS = (("one request at a time", 1, False), ("micro-batcher", CLIENTS, False),
              ("joining at block boundaries", CLIENTS, True))  # fmt: skip


def trace_rows(args: argparse.Namespace) -> dict[str, list[dict]]:
    """Two mixed traces on a block-causal MDM (blocks of ``block``), every request streamed, through one request
    at a time, the micro-batcher and joining at block boundaries:

    - ``burst``: 4 long requests (``long`` tokens) at once, then 12 short ones (``block`` tokens) every 50 ms. A
      quarter of the requests are long, so the p99 is a long request's latency;
    - ``stream``: ``stream`` short requests, one every ``gap_ms``, and one long request among them (the 11th). The
      p99 is then the short requests' tail: how long the requests that queue behind the long one wait."""
    texts = prompts(args, max(16, args.stream))

    def request(text: str, tokens: int) -> dict:
        return dict(body(args, text, stream=True), max_tokens=tokens, steps=tokens)

    burst_jobs = [(request(t, args.long), 0.0, "long") for t in texts[:4]]
    burst_jobs += [(request(t, args.block), 0.05 * (i + 1), "short") for i, t in enumerate(texts[4:16])]
    stream_jobs = [(request(t, args.long if i == 10 else args.block), i * args.gap_ms / 1000,
                    "long" if i == 10 else "short") for i, t in enumerate(texts[: args.stream])]  # fmt: skip
    rows: dict[str, list[dict]] = {"burst": [], "stream": []}
    for name, max_batch, join in SCHEDULERS:
        engine = engine_of(args, max_batch=max_batch, block_causal=True, join=join)
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
        return (*post(url, payload), kind)

    with ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(lambda job: send(*job), jobs))


def percentiles(timings: list[tuple[float, float, str]]) -> dict:
    latencies = sorted(t[0] for t in timings)
    p99 = latencies[min(len(latencies) - 1, int(round(0.99 * (len(latencies) - 1))))]
    short = [t[0] for t in timings if t[2] == "short"]
    return dict(p50=statistics.median(latencies), p99=p99, first=statistics.median(t[1] for t in timings),
                short=statistics.median(short))  # fmt: skip


def verdict(ok: bool) -> str:
    return "met" if ok else "not met"


def markdown(args: argparse.Namespace, tp: dict, single: dict, trace: dict[str, list[dict]]) -> str:
    lines = [
        "# hf-mdm serve against generate called directly",
        "",
        f"Written by `evaluation/bench_serve.py` (`make bench`): random MDM of hidden {args.hidden}, {args.layers} "
        f"layers, float32, CPU, {torch.get_num_threads()} thread(s); {args.new} new tokens in blocks of {args.block}, "
        f"{args.new} steps, temperature 0; loopback HTTP; medians over {args.repeats} rounds.",
        "",
        "| measure | served | direct | ratio | target |",
        "| --- | --- | --- | --- | --- |",
        f"| throughput, {CLIENTS} concurrent clients x {args.requests_per_client} requests, same batches "
        f"(mean batch {tp['mean_batch']:.1f}), requests/s | {tp['served_rps']:.2f} | {tp['direct_rps']:.2f} | "
        f"{tp['ratio']:.2f}x | >= 0.9x ({verdict(tp['ratio'] >= 0.9)}) |",
        f"| one request at a time, latency s | {single['served_s']:.3f} | {single['direct_s']:.3f} | "
        f"{single['ratio']:.2f}x | <= 1.1x ({verdict(single['ratio'] <= 1.1)}) |",
    ]
    return "\n".join(lines + trace_tables(args, trace)) + "\n"


def trace_tables(args: argparse.Namespace, trace: dict[str, list[dict]]) -> list[str]:
    header = [
        "",
        "| scheduler | p50 latency s | p99 latency s | short requests' median latency s | median time to first chunk s |",
        "| --- | --- | --- | --- | --- |",
    ]
    row = lambda r: f"| {r['name']} | {r['p50']:.3f} | {r['p99']:.3f} | {r['short']:.3f} | {r['first']:.3f} |"  # noqa: E731
    burst, stream = trace["burst"], trace["stream"]
    lines = [
        "",
        f"Mixed traces on the same MDM made block-causal (blocks of {args.block}), every request streamed, "
        f"{args.repeats} rounds. A stream: {args.stream} short requests of {args.block} tokens, one every "
        f"{args.gap_ms:.0f} ms, and one long request of {args.long} tokens among them (the 11th).",
        *header,
        *map(row, stream),
        "",
        f"Joining at block boundaries: p99 {stream[2]['p99']:.3f} s against the micro-batcher's "
        f"{stream[1]['p99']:.3f} s (target: lower; {verdict(stream[2]['p99'] < stream[1]['p99'])}).",
        "",
        f"A burst: 4 long requests of {args.long} tokens at once, then 12 short ones of {args.block} tokens every "
        "50 ms. A quarter of the requests are long, so the p99 is a long request's latency: joining runs the short "
        "requests between the long ones' blocks, and on a CPU, where a forward costs its rows' columns, the long "
        "requests pay for them.",
        *header,
        *map(row, burst),
        "",
        f"Joining at block boundaries: the long requests' p99 {burst[2]['p99']:.3f} s against the micro-batcher's "
        f"{burst[1]['p99']:.3f} s ({burst[2]['p99'] / burst[1]['p99']:.2f}x).",
    ]
    return lines


def parse(argv: Any = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests-per-client", type=int, default=2)
    p.add_argument("--wait-ms", type=float, default=20.0)
    p.add_argument("--gap-ms", type=float, default=80.0, help="the stream trace's time between requests")
    sizes = dict(hidden=256, layers=4, new=32, block=8, long=256, stream=100)
    quick = dict(hidden=32, layers=1, new=8, block=4, long=16, stream=20)
    return parse_table_arguments(p, argv, 3, sizes, quick)


def main(argv: Any = None) -> str:
    args = parse(argv)
    tp, single, trace = throughput(args), single_latency(args), trace_rows(args)
    return print_and_write(markdown(args, tp, single, trace), args.output)


if __name__ == "__main__":
    main()
