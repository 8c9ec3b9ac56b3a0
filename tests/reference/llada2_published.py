"""Reference outputs of the published LLaDA2.0 / LLaDA2.1 modeling code on tiny random models.

Runs the published ``modeling_llada2_moe.py`` and ``modeling_llada21_moe.py`` (with their configuration files, as
published: one package directory each) in their own environment, the transformers they were written for (4.56),
and stores what the tests compare hf_mdm with (``tests/fixtures/llada2_reference.json``):

- the logits of one forward per model type on a random canvas, with the published generate()'s bfloat16 additive
  block-causal mask and with the same mask as a boolean one;
- the tokens of the published ``generate()`` at temperature 0, and how many forwards it ran, for every case of
  ``tests/helpers/llada2_tiny.GENERATE_CASES``.

The published files are not part of this project; get them and point the script at them:

    python tests/reference/llada2_published.py --llada2 DIR_WITH_modeling_llada2_moe.py \
        --llada21 DIR_WITH_modeling_llada21_moe.py [--out tests/fixtures/llada2_reference.json]

(each DIR also holds its ``configuration_*.py`` and an empty ``__init__.py``). The stored data were made from the
copies of the published files that the dllm repository (github.com/ZHZisZZ/dllm, commit 62ebe4f3) vendors under
``dllm/pipelines/llada2/models`` and ``dllm/pipelines/llada21/models``, with torch 2.13.0 and transformers 4.56.2
(the versions are stored with the data).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
import llada2_tiny as tiny  # noqa: E402


def load_published(directory: str, modeling: str, configuration: str):
    """The published (config class, model class) from a package directory."""
    path = Path(directory).resolve()
    sys.path.insert(0, str(path.parent))
    config_module = importlib.import_module(f"{path.name}.{configuration}")
    model_module = importlib.import_module(f"{path.name}.{modeling}")
    return config_module.LLaDA2MoeConfig, model_module.LLaDA2MoeModelLM


def cast_float_masks_to_query_dtype() -> None:
    """The published generate() builds its mask in bfloat16, which torch's SDPA refuses next to float32 queries; the
    mask holds only 0 and -inf, exact in every float dtype, so it is cast to the queries' dtype (the reference runs
    in float32, the precision the tests compare at). Nothing else of the published code is changed."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def sdpa_float32_mask(module, query, key, value, attention_mask, **kwargs):
        if attention_mask is not None and attention_mask.is_floating_point():
            attention_mask = attention_mask.to(query.dtype)
        return sdpa(module, query, key, value, attention_mask, **kwargs)

    ALL_ATTENTION_FUNCTIONS["sdpa"] = sdpa_float32_mask


def build(classes, model_type: str):
    config_class, model_class = classes
    fields = {k: v for k, v in tiny.CONFIGS[model_type].items() if k != "model_type"}
    config = config_class(**fields, **tiny.RUNTIME)
    config._attn_implementation = "sdpa"
    model = model_class(config).eval()
    checksums = tiny.fill_weights(model, tiny.SEEDS[model_type])
    return model, checksums


class CountingForward:
    """Counts the model's forwards and checks that [MASK] is never the top token at a masked position (hf_mdm's
    sampler never proposes [MASK]; the published one can, so the tiny models must not)."""

    def __init__(self, model):
        self.model, self.calls = model, 0
        self.original = model.forward
        model.forward = self

    def __call__(self, input_ids, **kwargs):
        self.calls += 1
        out = self.original(input_ids, **kwargs)
        top = out.logits.argmax(-1)
        assert not (top[input_ids == tiny.MASK_ID] == tiny.MASK_ID).any(), "[MASK] proposed: pick another seed"
        return out


def run_generate(model, prompt, kwargs):
    counter = CountingForward(model)
    try:
        out = model.generate(prompt, temperature=0.0, mask_id=tiny.MASK_ID, **kwargs)
    finally:
        model.forward = counter.original
    return out[0].tolist(), counter.calls


def eos_candidates(model, prompt, kwargs) -> list[int]:
    """Tokens the model generates (with no EOS) first at a position inside a block after the prompt's, not at its
    edges, and not in the prompt: EOS ids that make EOS appear inside a block."""
    tokens, _ = run_generate(model, prompt, {**kwargs, "eos_id": -1, "eos_early_stop": False})
    block, start = kwargs.get("block_length", 32), prompt.shape[1]
    candidates = []
    for offset, token in enumerate(tokens):
        column = start + offset
        inside = column // block > start // block and 0 < column % block < block - 1
        if inside and token not in tokens[:offset] and token not in prompt[0].tolist():
            candidates.append(token)
    return candidates


def eos_inside_block(model, prompt_length: int, kwargs) -> tuple[torch.Tensor, int]:
    """A prompt and an EOS id (`eos_candidates`) for which ``eos_early_stop`` saves forwards, trying prompts of
    ``prompt_length`` from successive seeds (so that a case and its twin with ``eos_early_stop`` differ), whatever
    the case's own ``eos_early_stop``; the first candidate of the first prompt if none does."""
    first = None
    for seed in range(7, 47):
        prompt = tiny.prompt_ids(prompt_length, seed)
        for token in eos_candidates(model, prompt, kwargs):
            first = first or (prompt, token)
            _, late = run_generate(model, prompt, {**kwargs, "eos_id": token, "eos_early_stop": False})
            _, early = run_generate(model, prompt, {**kwargs, "eos_id": token, "eos_early_stop": True})
            if early < late:
                return prompt, token
    if first is None:
        raise RuntimeError("no token first generated inside a later block")
    return first


def absent_eos(model, prompt, kwargs) -> int:
    """An id the model never generates in this case (the EOS of a case without EOS)."""
    tokens, _ = run_generate(model, prompt, {**kwargs, "eos_id": -1})
    return next(t for t in range(tiny.MASK_ID - 1, 0, -1) if t not in tokens and t not in prompt[0].tolist())


def logits_reference(model, model_type: str) -> dict:
    generator = torch.Generator().manual_seed(99)
    length, block = 20, 8
    canvas = torch.randint(1, tiny.VOCAB, (1, length), generator=generator)
    canvas[0, 12:] = tiny.MASK_ID
    additive = tiny.block_causal_additive_mask(length, block)
    with torch.no_grad():
        logits = model(canvas, attention_mask=additive).logits
        boolean = model(canvas, attention_mask=additive == 0).logits
    rounded = lambda t: [[round(v, 6) for v in row] for row in t[0].tolist()]  # noqa: E731  (1e-6: below the test's 1e-4)
    return dict(
        canvas=canvas[0].tolist(), block_length=block, logits=rounded(logits), logits_boolean_mask=rounded(boolean)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llada2", required=True, help="package dir with modeling_llada2_moe.py")
    parser.add_argument("--llada21", required=True, help="package dir with modeling_llada21_moe.py")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "fixtures/llada2_reference.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    cast_float_masks_to_query_dtype()
    classes = {
        "llada2_moe": load_published(args.llada2, "modeling_llada2_moe", "configuration_llada2_moe"),
        "llada21_moe": load_published(args.llada21, "modeling_llada21_moe", "configuration_llada21_moe"),
    }
    import transformers

    result = {"transformers": transformers.__version__, "torch": torch.__version__, "models": {}, "cases": []}
    models = {}
    for model_type in tiny.CONFIGS:
        model, checksums = build(classes[model_type], model_type)
        models[model_type] = model
        result["models"][model_type] = dict(checksums=checksums, **logits_reference(model, model_type))
    for name, model_type, prompt_length, kwargs in tiny.GENERATE_CASES:
        model, prompt = models[model_type], tiny.prompt_ids(prompt_length)
        kwargs = dict(kwargs)
        if kwargs.pop("eos", None) == "eos":
            prompt, kwargs["eos_id"] = eos_inside_block(model, prompt_length, kwargs)
        else:
            kwargs["eos_id"] = absent_eos(model, prompt, kwargs)
        tokens, forwards = run_generate(model, prompt, kwargs)
        result["cases"].append(
            dict(
                name=name, model_type=model_type, prompt=prompt[0].tolist(), kwargs=kwargs, tokens=tokens, nfe=forwards
            )
        )
        print(f"{name:24s} nfe={forwards:3d} tokens={tokens}")
    Path(args.out).write_text(json.dumps(result, separators=(",", ":")) + "\n")
    print(f"wrote {args.out} ({Path(args.out).stat().st_size} bytes)")


if __name__ == "__main__":
    main()
