"""Weight-only int8 and int4 (torchao, `hf_mdm.quantization`) against bfloat16, for each family, on the CPU.

Models: random ones of each family at hidden 256, 4 layers, a 4,096-token vocabulary (hf_mdm's MDM, LLaDA, Dream,
LLaDA2's mixture of experts: 8 experts of width 256, 2 a token, one shared, the first layer dense), saved with
``save_pretrained`` and loaded three times: bfloat16, int8 and int4 (group size 32), quantized as they load. Random
weights give near-uniform logits, where any rounding flips the order of near-tied tokens; the LM head is scaled so
that the logits' standard deviation on a random input is 3 (about a trained model's spread), and the rest kept as
initialised. For each: the weights' memory (`hf_mdm.quantization.weight_bytes`: quantized tensors at their stored
size) and that of the quantized layers (the ``nn.Linear`` weights but the LM head's); the top-1 agreement with bfloat16
of one forward at every position of a half-masked batch; the token agreement at T=0 of a 64-token generation (batch 4,
a 32-token prompt each, blocks of 32, one token a step, no cache); ms per forward of that batch (96 positions),
medians of interleaved rounds after a warm-up round.

    python evaluation/bench_quant.py [--repeats 5] [--threads 1] [--output FILE.md] [--quick]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers

sys.path.insert(0, str(Path(__file__).parent))
from bench_measure import Stopwatch, parse_table_arguments, print_and_write  # noqa: E402

from hf_mdm import MDMConfig, MDMForMaskedDiffusion  # noqa: E402
from hf_mdm.models import DreamConfig, DreamModel, LLaDA2MoeConfig, LLaDA2MoeModelLM, LLaDAConfig, LLaDAModelLM  # noqa: E402
from hf_mdm.quantization import linear_weight_bytes, quantization_config, tensor_bytes, weight_bytes  # noqa: E402

VARIANTS = {"bfloat16": None, "int8": "int8", "int4": "int4"}
LOGIT_STD = 3.0


def families(args: argparse.Namespace) -> dict[str, Any]:
    """Each family's (class, config), the [MASK] id the last of the vocabulary."""
    h, n, v = args.hidden, args.layers, args.vocab
    ids = dict(vocab_size=v, mask_token_id=v - 1, eos_token_id=v - 2, pad_token_id=0)
    llada = dict(d_model=h, n_heads=4, n_kv_heads=4, n_layers=n, mlp_hidden_size=4 * h, embedding_size=v)
    qwen = dict(hidden_size=h, num_hidden_layers=n, num_attention_heads=4, num_key_value_heads=2)
    moe = dict(qwen, head_dim=h // 4, intermediate_size=4 * h, moe_intermediate_size=h, num_experts=8)
    moe.update(num_experts_per_tok=2, num_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1)
    return {
        "MDM": (MDMForMaskedDiffusion, MDMConfig(**qwen, intermediate_size=4 * h, **ids)),
        "LLaDA": (LLaDAModelLM, LLaDAConfig(**llada, **ids)),
        "Dream": (DreamModel, DreamConfig(**qwen, intermediate_size=4 * h, **ids)),
        "LLaDA2 (MoE)": (LLaDA2MoeModelLM, LLaDA2MoeConfig(**moe, **ids)),
    }


def build(cls: type, config: Any, directory: Path) -> str:
    """A random model (seed 0) with its LM head scaled to logits of standard deviation LOGIT_STD, saved."""
    torch.manual_seed(0)
    model = cls(config).eval()
    probe = torch.randint(0, config.vocab_size - 2, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        std = model(probe).logits.float().std()
        model.get_output_embeddings().weight.mul_(LOGIT_STD / std)
    model.save_pretrained(directory)
    return str(directory)


def load(path: str, quantization: Any, args: argparse.Namespace) -> torch.nn.Module:
    kwargs = {"group_size": args.group_size} if quantization == "int4" else {}
    config = quantization_config(quantization, "cpu", **kwargs)
    return transformers.AutoModelForMaskedLM.from_pretrained(
        path, dtype=torch.bfloat16, quantization_config=config
    ).eval()


@torch.no_grad()
def measure_family(path: str, args: argparse.Namespace) -> dict[str, dict]:
    models = {name: load(path, q, args) for name, q in VARIANTS.items()}
    vocab, mask = models["bfloat16"].config.vocab_size, models["bfloat16"].config.mask_token_id
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(1, vocab - 2, (args.batch, args.prompt), generator=gen)
    batch = torch.cat([prompt, torch.randint(1, vocab - 2, (args.batch, args.new_tokens), generator=gen)], dim=1)
    batch[torch.rand(batch.shape, generator=gen) < 0.5] = mask  # half-masked: a step's input
    top1, tokens, times = {}, {}, {name: [] for name in models}
    for name, model in models.items():
        top1[name] = model(batch).logits.argmax(-1)
        tokens[name] = model.generate(
            prompt, max_new_tokens=args.new_tokens, steps=args.new_tokens, block_length=args.block,
            temperature=0.0, stop_at_eos=False,
        )[:, args.prompt :]  # fmt: skip
    for round_ in range(1 + args.repeats):
        for name, model in models.items():
            with Stopwatch("cpu") as watch:
                model(batch)
            if round_:
                times[name].append(watch.seconds)
    rows = {}
    for name, model in models.items():
        rows[name] = dict(
            bytes=weight_bytes(model), ms=1000 * statistics.median(times[name]),
            linear=linear_weight_bytes(model) - tensor_bytes(model.get_output_embeddings().weight),
            top1=(top1[name] == top1["bfloat16"]).float().mean().item(),
            agreement=(tokens[name] == tokens["bfloat16"]).float().mean().item(),
        )  # fmt: skip
    return rows


def measure(args: argparse.Namespace) -> dict[str, dict]:
    logging.getLogger("torchao").setLevel(logging.ERROR)  # its CUDA kernels' libraries do not load on a CPU build
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    table = {}
    with tempfile.TemporaryDirectory() as root:
        for family, (cls, config) in families(args).items():
            path = build(cls, config, Path(root) / family.split()[0])
            table[family] = measure_family(path, args)
            print(f"  {family} done", file=sys.stderr, flush=True)
    return table


def markdown(args: argparse.Namespace, table: dict[str, dict]) -> str:
    import torchao

    mib = 2**20
    lines = [
        "# Weight-only quantization: int8 and int4 against bfloat16",
        "",
        f"Written by `evaluation/bench_quant.py`: random models of hidden {args.hidden}, {args.layers} layers, "
        f"vocabulary {args.vocab} (LM head scaled to logits of std {LOGIT_STD:g}), loaded in bfloat16 and quantized "
        f"as they load (torchao {torchao.__version__}: int8 weight-only, int4 weight-only in groups of "
        f"{args.group_size}); CPU, {torch.get_num_threads()} thread(s), torch {torch.__version__}. Memory: the "
        "parameters at their stored size; *quantized layers*: the `nn.Linear` weights but the LM head's (which stays "
        "in bfloat16, as do the embeddings and norms). "
        f"*top-1*: one forward of a half-masked batch ({args.batch} x {args.prompt + args.new_tokens}), the share of "
        f"positions whose most likely token is bfloat16's; *tokens*: a {args.new_tokens}-token generation at T=0 "
        f"(batch {args.batch}, {args.prompt}-token prompts, blocks of {args.block}, one token a step), the share of "
        f"generated tokens equal to bfloat16's; ms per forward of that batch, median of {args.repeats} interleaved "
        "rounds after a warm-up round. LLaDA2's routed experts are 3-D parameters, not `nn.Linear` layers: they "
        "stay in bfloat16.",
        "",
        "| family | weights | memory MiB | / bfloat16 | quantized layers MiB | / bfloat16 | top-1 agreement | "
        "token agreement | ms / forward |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for family, rows in table.items():
        base = rows["bfloat16"]
        for name, r in rows.items():
            lines.append(
                f"| {family} | {name} | {r['bytes'] / mib:.2f} | {r['bytes'] / base['bytes']:.2f} | "
                f"{r['linear'] / mib:.2f} | {r['linear'] / base['linear']:.2f} | {r['top1']:.3f} | "
                f"{r['agreement']:.3f} | {r['ms']:.1f} |"
            )
    return "\n".join(lines) + "\n"


def parse(argv: Any = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sizes = dict(hidden=256, layers=4, vocab=4096, batch=4, prompt=32, new_tokens=64, block=32, group_size=32)
    quick = dict(hidden=64, layers=1, vocab=256, batch=2, prompt=4, new_tokens=8, block=4)
    return parse_table_arguments(p, argv, 5, sizes, quick)


def main(argv: Any = None) -> str:
    args = parse(argv)
    return print_and_write(markdown(args, measure(args)), args.output)


if __name__ == "__main__":
    main()
