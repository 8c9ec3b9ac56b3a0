"""hf_mdm beside diffusers' ``LLaDA2Pipeline`` (diffusers 0.42, run here, not mocked).

- hf_mdm's native LLaDA2.0 / 2.1 classes run inside the pipeline (its model contract: a 2-D attention mask and
  position ids in, logits out) and give there the tokens of LLaDA2's published generate() (the stored reference of
  ``tests/fixtures/llada2_reference.json``) once the pipeline's one layout difference is undone: it hides the last
  block's positions past ``gen_length`` from attention, the published generate() attends to them;
- ``MaskedDiffusionGenerationConfig.llada2_pipeline`` reproduces the pipeline with its ``BlockRefinementScheduler``
  token for token at temperature 0, with editing on and off, with and without ``eos_early_stop``, on the tiny
  models whose logits are spread (``tests/helpers/llada2_tiny.py``), and with the pipeline's forwards less the ones
  whose output it discards.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_llada2 import REFERENCE, build

from hf_mdm import MaskedDiffusionGenerationConfig

diffusers = pytest.importorskip("diffusers")
PAD = 0
MASK_ID = 47
CASES = {case["name"]: case for case in REFERENCE["cases"]}


@pytest.fixture(scope="module")
def models() -> dict:
    return {model_type: build(model_type) for model_type in ("llada2_moe", "llada21_moe")}


class Counter:
    """Forward pre-hook on the model the pipeline calls: counts forwards and the ones whose current block held no
    [MASK] (with editing off their output is discarded); ``attend_tail`` undoes the pipeline's hiding of the last
    block's tail (every position attended, as LLaDA2's generate() lays the canvas out)."""

    def __init__(self, block_length: int, attend_tail: bool = False):
        self.block_length, self.attend_tail = block_length, attend_tail
        self.forwards = self.without_masks = 0

    def __call__(self, module, args, kwargs):
        input_ids = args[0] if args else kwargs["input_ids"]
        self.forwards += 1
        self.without_masks += int(not bool((input_ids[:, -self.block_length :] == MASK_ID).any()))
        if self.attend_tail:
            kwargs["attention_mask"] = torch.ones_like(kwargs["attention_mask"])
        return args, kwargs


def pipeline_args(case: dict, **changes) -> dict:
    """The pipeline's arguments for a reference case (its own editing settings for LLaDA2.1, none for LLaDA2.0)."""
    kwargs = case["kwargs"]
    args = dict(
        gen_length=kwargs["gen_length"],
        block_length=kwargs.get("block_length", 32),
        num_inference_steps=kwargs.get("steps", 32),
        threshold=kwargs.get("threshold", 0.95),
        minimal_topk=kwargs.get("minimal_topk", 1),
        editing_threshold=kwargs.get("editing_threshold", 0.9) if case["model_type"] == "llada21_moe" else None,
        max_post_steps=kwargs.get("max_post_steps", 16),
        eos_early_stop=kwargs.get("eos_early_stop", False),
        eos_token_id=kwargs["eos_id"],
    )
    return {**args, **changes}


def run_pipeline(model, prompt: torch.Tensor, attend_tail: bool = False, **args) -> tuple[torch.Tensor, Counter]:
    model.config.block_size = args["block_length"]  # the pipeline passes no block size: the model's own is used
    counted = Counter(args["block_length"], attend_tail)
    hook = model.register_forward_pre_hook(counted, with_kwargs=True)
    try:
        pipe = diffusers.LLaDA2Pipeline(model=model, scheduler=diffusers.BlockRefinementScheduler(), tokenizer=None)
        pipe.set_progress_bar_config(disable=True)
        out = pipe(input_ids=prompt, use_chat_template=False, mask_token_id=MASK_ID, output_type="seq", **args)
    finally:
        hook.remove()
    return out.sequences, counted


def up_to_eos(tokens: list[int], eos_id: int) -> list[int]:
    return tokens[: tokens.index(eos_id) + 1] if eos_id in tokens else tokens


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case["model_type"] == "llada2_moe"])
def test_hf_mdm_classes_in_the_pipeline_give_the_published_tokens(models, name):
    case = CASES[name]
    prompt = torch.tensor([case["prompt"]])
    args = pipeline_args(case)
    sequences, _ = run_pipeline(models[case["model_type"]], prompt, attend_tail=True, **args)
    assert up_to_eos(sequences[0].tolist(), args["eos_token_id"]) == case["tokens"]


def test_the_pipeline_hides_the_last_blocks_tail(models):
    """The one layout difference: hidden, the tail changes the tokens of a case whose canvas ends past gen_length."""
    case = CASES["long_prompt"]  # 13 + 20 positions in blocks of 8: 7 tail positions
    prompt, args = torch.tensor([case["prompt"]]), pipeline_args(case)
    hidden, _ = run_pipeline(models[case["model_type"]], prompt, **args)
    assert hidden[0].tolist() != case["tokens"]


def hf_mdm_run(model, prompt: torch.Tensor, kv_cache: str = "prefix", **args):
    config = MaskedDiffusionGenerationConfig.llada2_pipeline(
        **args, pad_token_id=PAD, kv_cache=kv_cache, return_dict_in_generate=True
    )
    return model.generate(prompt, generation_config=config)


def assert_same_as_pipeline(model, prompt: torch.Tensor, kv_cache: str = "prefix", **args) -> None:
    expected, counted = run_pipeline(model, prompt, **args)
    out = hf_mdm_run(model, prompt, kv_cache, **args)
    width = prompt.shape[1]
    assert torch.equal(out.sequences[:, :width], prompt)
    for row, tokens in zip(out.sequences[:, width:].tolist(), expected.tolist()):
        cut = len(up_to_eos(tokens, args["eos_token_id"]))
        assert row[:cut] == tokens[:cut]
        assert set(row[cut:]) <= {PAD}
    editing = args["editing_threshold"] is not None and args["editing_threshold"] > 0
    discarded = 0 if editing else counted.without_masks
    assert out.nfe == counted.forwards - discarded


NO_CACHE_CASES = ("long_prompt", "steps_not_dividing", "edit_fires", "edit_post_steps")


@pytest.mark.parametrize(
    "name, kv_cache", [(name, "prefix") for name in CASES] + [(name, "none") for name in NO_CACHE_CASES]
)
def test_preset_equals_the_pipeline(models, name, kv_cache):
    case = CASES[name]
    assert_same_as_pipeline(models[case["model_type"]], torch.tensor([case["prompt"]]), kv_cache, **pipeline_args(case))


@pytest.mark.parametrize("eos_early_stop", [False, True])
@pytest.mark.parametrize("editing_threshold", [0.2, 0.5, 0.9])
@pytest.mark.parametrize("name", ["long_prompt", "default_block"])
def test_preset_equals_the_pipeline_with_editing(models, name, editing_threshold, eos_early_stop):
    case = CASES[name]
    args = pipeline_args(case, editing_threshold=editing_threshold, eos_early_stop=eos_early_stop)
    assert_same_as_pipeline(models["llada21_moe"], torch.tensor([case["prompt"]]), **args)


def test_pipeline_defaults_are_the_presets(models):
    """The pipeline's own defaults (threshold 0.7, editing 0.5, 16 post steps, eos_early_stop, blocks of 32)."""
    import inspect

    signature = inspect.signature(diffusers.LLaDA2Pipeline.__call__).parameters
    preset = inspect.signature(MaskedDiffusionGenerationConfig.llada2_pipeline).parameters
    for name in ("gen_length", "num_inference_steps", "temperature", "threshold", "editing_threshold"):
        assert preset[name].default == signature[name].default, name
    for name in ("max_post_steps", "minimal_topk", "eos_early_stop", "top_p", "top_k"):
        assert preset[name].default == signature[name].default, name
    assert preset["block_length"].default == diffusers.BlockRefinementScheduler().config.block_length
    prompt = torch.tensor([CASES["default_block"]["prompt"]])
    args = dict(gen_length=40, eos_token_id=CASES["default_block"]["kwargs"]["eos_id"])
    expected, _ = run_pipeline(models["llada21_moe"], prompt, block_length=32, **args)
    out = models["llada21_moe"].generate(
        prompt, generation_config=MaskedDiffusionGenerationConfig.llada2_pipeline(**args, pad_token_id=PAD)
    )
    tokens = expected[0].tolist()
    cut = len(up_to_eos(tokens, args["eos_token_id"]))
    assert out[0, prompt.shape[1] :].tolist()[:cut] == tokens[:cut]


def test_a_batch_runs_each_row_as_the_pipeline_runs_it_alone(models):
    model = models["llada21_moe"]
    generator = torch.Generator().manual_seed(3)
    prompts = torch.randint(1, MASK_ID - 1, (3, 6), generator=generator)
    case = CASES["short_prompt"]
    for editing_threshold in (None, 0.5):
        args = pipeline_args(case, editing_threshold=editing_threshold, eos_early_stop=True)
        out = hf_mdm_run(model, prompts, **args)
        for row in range(3):
            alone, _ = run_pipeline(model, prompts[row : row + 1], **args)
            tokens = alone[0].tolist()
            cut = len(up_to_eos(tokens, args["eos_token_id"]))
            assert out.sequences[row, 6:].tolist()[:cut] == tokens[:cut]
    batched, _ = run_pipeline(model, prompts, **pipeline_args(case, editing_threshold=None))
    out = hf_mdm_run(model, prompts, **pipeline_args(case, editing_threshold=None))
    eos = case["kwargs"]["eos_id"]
    for row, tokens in zip(out.sequences[:, 6:].tolist(), batched.tolist()):
        assert row[: len(up_to_eos(tokens, eos))] == up_to_eos(tokens, eos)


def test_a_prompt_holding_eos_never_stops_early_in_the_pipeline(models):
    """The documented difference (docs/peers.md, the preset's docstring): the pipeline looks for the first EOS over
    the whole sequence, prompt included, so on a prompt that holds the EOS id its ``eos_early_stop`` never fires: it
    runs what it runs without it, which the preset reproduces with ``eos_early_stop=False``; the preset with it stops
    the row at its first generated EOS, as on any other prompt."""
    model, case = models["llada21_moe"], CASES["edit_eos"]
    args = pipeline_args(case, eos_early_stop=True)
    prompt, eos = torch.tensor([case["prompt"]]), args["eos_token_id"]
    off = {**args, "eos_early_stop": False}
    assert run_pipeline(model, prompt, **args)[1].forwards < run_pipeline(model, prompt, **off)[1].forwards
    prompt[0, 2] = eos  # a turn that ended before the prompt does
    stopping, counted = run_pipeline(model, prompt, **args)
    running, counted_off = run_pipeline(model, prompt, **off)
    assert torch.equal(stopping, running) and counted.forwards == counted_off.forwards
    assert hf_mdm_run(model, prompt, **args).nfe < counted.forwards
    assert_same_as_pipeline(model, prompt, **off)
    doc = " ".join(MaskedDiffusionGenerationConfig.llada2_pipeline.__doc__.split())
    readme = " ".join((Path(__file__).parents[2] / "docs" / "peers.md").read_text().split())
    for text in (doc, readme):
        assert "never stops a row whose prompt holds the EOS id" in text


def test_the_published_presets_differ_from_the_pipeline(models):
    """Without the preset: LLaDA2's own generate() (hf_mdm's llada2 / llada21 presets) is not the pipeline."""
    differ = 0
    for name in ("long_prompt", "edit_fires", "edit_post_steps"):
        case = CASES[name]
        prompt, args = torch.tensor([case["prompt"]]), pipeline_args(case)
        expected, _ = run_pipeline(models[case["model_type"]], prompt, **args)
        kwargs = {**case["kwargs"]}
        preset = MaskedDiffusionGenerationConfig.llada2
        if case["model_type"] == "llada21_moe":
            preset = MaskedDiffusionGenerationConfig.llada21
        out = models[case["model_type"]].generate(prompt, generation_config=preset(**kwargs, pad_token_id=PAD))
        differ += out[0, prompt.shape[1] :].tolist() != expected[0].tolist()
    assert differ == 3


def test_clear_errors():
    with pytest.raises(ValueError, match="minimal_topk"):
        MaskedDiffusionGenerationConfig.llada2_pipeline(gen_length=4, minimal_topk=8)
    with pytest.raises(ValueError, match="whole_blocks=True"):
        MaskedDiffusionGenerationConfig(hide_block_tail=True, max_new_tokens=8)
    with pytest.raises(ValueError, match="llada2_pipeline"):
        from hf_mdm.generation_editing import BlockRefinementTransfer

        BlockRefinementTransfer.from_config(MaskedDiffusionGenerationConfig(transfer="block_refinement"))


def test_hf_diffusers_runs_the_pipeline_in_lm_eval(tmp_path):
    """``hf_diffusers`` answers what hf_mdm answers with the pipeline's settings, and counts the pipeline's forwards."""
    from lm_eval.api.instance import Instance

    from hf_mdm.harness.models import DiffusersPipelineLM, MaskedDiffusionLM
    from hf_mdm.harness.tiny import build_tiny_models

    path = build_tiny_models(tmp_path)["llada2"]
    peer = DiffusersPipelineLM(pretrained=path, device="cpu", editing_threshold=None)
    prompt = "Q: 2 + 3?\nA:"
    request = Instance("generate_until", {}, (prompt, {"max_gen_toks": 16, "until": ["\n\n"]}), 0, ("demo", 0, 1))
    (text,) = peer.generate_until([request])
    (record,) = peer.timing.records
    preset = MaskedDiffusionGenerationConfig.llada2_pipeline(gen_length=16, editing_threshold=None)
    fields = {name: getattr(preset, name) for name in ("transfer", "steps", "threshold", "block_length")}
    fields.update(whole_blocks=True, hide_block_tail=True, eos_early_stop=True, finish_at_eos=True)
    ours = MaskedDiffusionLM(pretrained=path, device="cpu", reference="none", **fields)
    assert ours.generate_until([request]) == [text]
    (own,) = ours.timing.records
    assert own.nfe < record.nfe  # the pipeline's discarded forward of each block
    with pytest.raises(ValueError, match="block_length=32"):
        DiffusersPipelineLM(pretrained=path, device="cpu", block_length=8)
