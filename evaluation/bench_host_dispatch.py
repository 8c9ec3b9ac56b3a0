"""The host's share of a forward and of a generate call, with autograd off (``torch.no_grad``) against
``torch.inference_mode`` (what ``generate`` runs under), on the CPU (issue 54: at batch 1 an 8B forward on one GPU
waits for the host's ~6,900 ATen dispatches).

Models: LLaDA-8B's and our MDM's depth (32 layers) at a width where the arithmetic is small (hidden 64, 4 heads, MLP
256, vocabulary 1,024), so that a forward's time is mostly the host dispatching its operators, as on a GPU at batch 1.
*ops / forward*: the ATen operators one forward dispatches (a `TorchDispatchMode` counter). Rows: one forward over
512 positions (batch 1), and a whole ``generate`` (64 + 192 tokens, blocks of 32, 48 steps) with no cache, the
prefix and the dual cache: at this width a cache's forward costs what its host work costs (on a GPU at batch 1 the
prefix cache was slower than none, results/gpu). The two modes run interleaved in one process
(`bench_measure.interleave`: one warm-up round, then ``--repeats`` rounds each calling every run once), medians; the
tokens of the two modes are asserted equal.

Run: ``python evaluation/bench_host_dispatch.py [--repeats 7] [--json out]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).parent))
from bench_measure import interleave  # noqa: E402

from hf_mdm import MDMConfig, MDMForMaskedDiffusion  # noqa: E402
from hf_mdm.generation import diffusion_generate  # noqa: E402
from hf_mdm.models import LLaDAConfig, LLaDAModelLM  # noqa: E402

VOCAB, LAYERS, HIDDEN = 1024, 32, 64
GENERATE = dict(max_new_tokens=192, steps=48, block_length=32, stop_at_eos=False, seed=0)
MODES: dict[str, Callable[[], Any]] = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


class OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        self.ops[func._schema.name] += 1
        return func(*args, **(kwargs or {}))


def models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    llada = LLaDAConfig(d_model=HIDDEN, n_heads=4, n_kv_heads=4, n_layers=LAYERS, mlp_hidden_size=4 * HIDDEN,
                        vocab_size=VOCAB, embedding_size=VOCAB, mask_token_id=VOCAB - 1, eos_token_id=1,
                        pad_token_id=1, weight_tying=False, max_sequence_length=1024)  # fmt: skip
    mdm = MDMConfig(vocab_size=VOCAB, mask_token_id=VOCAB - 1, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                    num_attention_heads=4, intermediate_size=4 * HIDDEN, max_position_embeddings=1024)  # fmt: skip
    return {"LLaDA": LLaDAModelLM(llada).eval(), "MDM": MDMForMaskedDiffusion(mdm).eval()}


def in_mode(mode: str, call: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        with MODES[mode]():
            return call()

    return run


def calls_of(model: torch.nn.Module) -> dict[str, Callable[[], Any]]:
    """The rows of one model: a forward of 512 positions, generate with no cache, the prefix and the dual cache."""
    ids = torch.randint(0, VOCAB - 2, (1, 512), generator=torch.Generator().manual_seed(0))
    prompt = ids[:, :64]
    return {
        "forward, 512 positions": lambda: model(ids).logits,
        "generate, no cache": lambda: diffusion_generate.__wrapped__(model, prompt, **GENERATE),
        "generate, prefix cache": lambda: diffusion_generate.__wrapped__(model, prompt, kv_cache="prefix", **GENERATE),
        "generate, dual cache": lambda: diffusion_generate.__wrapped__(model, prompt, kv_cache="dual", **GENERATE),
    }


def ops_per_forward(model: torch.nn.Module, mode: str) -> int:
    ids = torch.randint(0, VOCAB - 2, (1, 512), generator=torch.Generator().manual_seed(0))
    with MODES[mode](), OpCounter() as counter:
        model(ids)
    return sum(counter.ops.values())


def measure(repeats: int, say: Callable[[str], None]) -> list[dict]:
    rows = []
    for name, model in models().items():
        calls = calls_of(model)
        runs = {f"{row}|{mode}": (model, in_mode(mode, call)) for row, call in calls.items() for mode in MODES}
        for row, call in calls.items():  # the modes give the same tokens
            outputs = [in_mode(mode, call)() for mode in MODES]
            assert all(torch.equal(outputs[0], other) for other in outputs[1:]), f"{name}, {row}: outputs differ"
        series = interleave(runs, repeats, 1, progress=lambda line, n=name: say(f"{n}: {line}"))
        for row in calls:
            entry: dict[str, Any] = dict(model=name, row=row)
            for mode in MODES:
                s = series[f"{row}|{mode}"]
                entry[f"ms_{mode}"] = 1e3 * s.median
                entry[f"forward_ms_{mode}"] = 1e3 * s.forward_median / max(s.calls[0].forwards, 1)
                entry["forwards"] = s.calls[0].forwards
            pairs = zip(series[f"{row}|inference_mode"].calls, series[f"{row}|no_grad"].calls)
            entry["ratios"] = [a.seconds / b.seconds for a, b in pairs]
            entry["ops_per_forward"] = {mode: ops_per_forward(model, mode) for mode in MODES}
            rows.append(entry)
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| model | row | forwards | ops a forward of 512 | ms, no_grad | ms, inference_mode | inference / no_grad: median "
        "(range) | ms a forward, no_grad | ms a forward, inference_mode |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratios = r["ratios"]
        lines.append(
            f"| {r['model']} | {r['row']} | {r['forwards']} | {r['ops_per_forward']['no_grad']} | "
            f"{r['ms_no_grad']:.1f} | {r['ms_inference_mode']:.1f} | {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f}) | {r['forward_ms_no_grad']:.2f} | "
            f"{r['forward_ms_inference_mode']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds after one warm-up round")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1 on a shared machine)")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"bench_host_dispatch: {LAYERS} layers of width {HIDDEN}, vocabulary {VOCAB}, batch 1; {platform.machine()}, "
        f"{args.threads} thread(s), torch {torch.__version__}; 1 warm-up + {args.repeats} interleaved rounds",
        flush=True,
    )
    rows = measure(args.repeats, lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
