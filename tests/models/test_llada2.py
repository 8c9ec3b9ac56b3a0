"""Native LLaDA2.0 / LLaDA2.1: the published checkpoints' format loads without remote code, and the forward and the
published generate() presets reproduce the published code.

The reference numbers (``tests/fixtures/llada2_reference.json``) come from the published ``modeling_llada2_moe.py``
and ``modeling_llada21_moe.py`` run on tiny random models in their own environment (transformers 4.56) by
``tests/reference/llada2_published.py``; `llada2_tiny` builds the same weights here (checked by checksums, which
also checks that parameter names and shapes match the published ones).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import llada2_tiny as tiny
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM
from transformers.core_model_loading import revert_weight_conversion

import hf_mdm  # noqa: F401  (registers the Auto classes)
from hf_mdm import MaskedDiffusionGenerationConfig
from hf_mdm.host_syncs import count_host_syncs
from hf_mdm.models import LLaDA2MoeConfig, LLaDA2MoeModelLM, LLaDA21MoeConfig, LLaDA21MoeModelLM

REFERENCE = json.loads((Path(__file__).parents[1] / "fixtures/llada2_reference.json").read_text())
MODEL_TYPES = list(tiny.CONFIGS)
LOGITS_ATOL = 1e-4


def build(model_type: str, attn_implementation: str = "sdpa") -> torch.nn.Module:
    """The tiny model of ``model_type`` with the reference's weights, through the Auto classes."""
    config = AutoConfig.for_model(**tiny.CONFIGS[model_type], mask_token_id=tiny.MASK_ID, eos_token_id=tiny.MASK_ID - 1)
    config._attn_implementation = attn_implementation
    model = AutoModel.from_config(config)
    published = revert_weight_conversion(model, model.state_dict())  # the published per-expert layout
    checksums = tiny.fill_weights(published, tiny.SEEDS[model_type])
    assert checksums == pytest.approx(REFERENCE["models"][model_type]["checksums"], rel=1e-12)
    return type(model).from_pretrained(None, config=config, state_dict=published).eval()


@pytest.fixture(scope="module", params=MODEL_TYPES)
def model_type(request) -> str:
    return request.param


def published_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights as a checkpoint holds them (what save_pretrained writes)."""
    return revert_weight_conversion(model, model.state_dict())


def reference_logits(model_type: str) -> tuple[torch.Tensor, int, torch.Tensor]:
    entry = REFERENCE["models"][model_type]
    return torch.tensor([entry["canvas"]]), entry["block_length"], torch.tensor(entry["logits"])


def test_classes_and_parameter_names_are_the_published_ones(model_type):
    model = build(model_type)
    expected = {"llada2_moe": (LLaDA2MoeConfig, LLaDA2MoeModelLM), "llada21_moe": (LLaDA21MoeConfig, LLaDA21MoeModelLM)}
    assert (type(model.config), type(model)) == expected[model_type]
    names = set(published_state_dict(model))
    assert len(names) == len(REFERENCE["models"][model_type]["checksums"])
    first_moe = tiny.CONFIGS[model_type]["first_k_dense_replace"]
    for name in (
        "model.word_embeddings.weight",
        "model.layers.0.attention.query_key_value.weight",
        "model.layers.0.attention.query_layernorm.weight",
        "model.layers.0.attention.dense.weight",
        "model.layers.0.mlp.gate_proj.weight",
        f"model.layers.{first_moe}.mlp.gate.expert_bias",
        f"model.layers.{first_moe}.mlp.experts.7.down_proj.weight",
        f"model.layers.{first_moe}.mlp.shared_experts.up_proj.weight",
        "lm_head.weight",
    ):
        assert name in names, name


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("mask_kind", ["additive_bf16", "boolean", "own_blocks"])
def test_logits_equal_the_published_code(model_type, attn_implementation, mask_kind):
    canvas, block_length, expected = reference_logits(model_type)
    model = build(model_type, attn_implementation)
    additive = tiny.block_causal_additive_mask(canvas.shape[1], block_length)
    mask = {"additive_bf16": additive, "boolean": additive == 0, "own_blocks": None}[mask_kind]
    with torch.no_grad():
        logits = model(canvas, attention_mask=mask, block_size=block_length).logits[0]
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, expected, atol=LOGITS_ATOL, rtol=0)
    if mask_kind == "boolean":
        published_boolean = torch.tensor(REFERENCE["models"][model_type]["logits_boolean_mask"])
        torch.testing.assert_close(logits, published_boolean, atol=LOGITS_ATOL, rtol=0)


@pytest.mark.parametrize("experts_implementation", ["eager", "grouped_mm", "batched_mm"])
def test_every_experts_implementation_gives_the_published_logits(model_type, experts_implementation):
    """The routed experts are held fused (one 3-D tensor per projection), so transformers' experts implementations
    run them; each gives the published code's logits."""
    canvas, block_length, expected = reference_logits(model_type)
    model = build(model_type)
    model.set_experts_implementation(experts_implementation)
    assert model.config._experts_implementation == experts_implementation
    with torch.no_grad():
        logits = model(canvas, block_size=block_length).logits[0]
    torch.testing.assert_close(logits, expected, atol=LOGITS_ATOL, rtol=0)


def test_saved_checkpoints_keep_the_published_layout(model_type, tmp_path):
    """save_pretrained splits the fused experts back into the published per-expert tensors, and loading fuses them
    again: the same weights and logits."""
    model = build(model_type)
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as saved:
        names = set(saved.keys())
    assert names == set(published_state_dict(model))
    assert len(names) == len(REFERENCE["models"][model_type]["checksums"])
    num_experts, first_moe = model.config.num_experts, model.config.first_k_dense_replace
    assert f"model.layers.{first_moe}.mlp.experts.{num_experts - 1}.up_proj.weight" in names
    assert not any(name.endswith(("gate_up_proj", "experts.down_proj")) for name in names)
    reloaded = AutoModel.from_pretrained(tmp_path).eval()
    for name, tensor in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name


def test_block_size_changes_the_logits(model_type):
    """The reference's blocks matter: bidirectional attention, or other blocks, give other logits."""
    canvas, block_length, expected = reference_logits(model_type)
    model = build(model_type)
    with torch.no_grad():
        default = model(canvas).logits[0]  # config.block_size = 32 > the canvas: one block, bidirectional
        other = model(canvas, block_size=block_length // 2).logits[0]
    assert model.config.block_size == 32
    assert (default - expected).abs().max() > 1e-2
    assert (other - expected).abs().max() > 1e-2


def test_padding_mask_combines_with_blocks(model_type):
    """A left-padded row, its positions counted from its first token, gives the logits it has alone."""
    canvas, block_length, expected = reference_logits(model_type)
    model = build(model_type)
    pad = 3
    padded = torch.cat([torch.zeros(1, pad, dtype=torch.long), canvas], dim=1)
    attention_mask = (torch.arange(padded.shape[1]) >= pad).long()[None]
    position_ids = (torch.arange(padded.shape[1]) - pad).clamp(min=0)[None]
    with torch.no_grad():
        logits = model(padded, attention_mask=attention_mask, position_ids=position_ids, block_size=block_length)
    torch.testing.assert_close(logits.logits[0, pad:], expected, atol=LOGITS_ATOL, rtol=0)


def published_config_json(model_type: str) -> dict:
    """A config.json in the published format: the published keys (tiny sizes), ``architectures`` and ``auto_map``
    naming the remote code, no hf_mdm keys."""
    module = {"llada2_moe": "modeling_llada2_moe", "llada21_moe": "modeling_llada21_moe"}[model_type]
    configuration = module.replace("modeling", "configuration")
    return {
        **tiny.CONFIGS[model_type],
        **tiny.RUNTIME,
        "architectures": ["LLaDA2MoeModelLM"],
        "auto_map": {
            "AutoConfig": f"{configuration}.LLaDA2MoeConfig",
            "AutoModel": f"{module}.LLaDA2MoeModel",
            "AutoModelForCausalLM": f"{module}.LLaDA2MoeModelLM",
        },
        "initializer_range": 0.02,
        "torch_dtype": "float32",
        "transformers_version": "4.56.2",
        "use_cache": False,
    }


@pytest.mark.parametrize("auto_class", [AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM])
def test_published_checkpoint_loads_without_remote_code(model_type, auto_class, tmp_path):
    canvas, block_length, expected = reference_logits(model_type)
    weights = {name: tensor.clone().contiguous() for name, tensor in published_state_dict(build(model_type)).items()}
    (tmp_path / "config.json").write_text(json.dumps(published_config_json(model_type)))
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    model = auto_class.from_pretrained(tmp_path).eval()
    assert model.config.model_type == model_type
    assert model.config.mask_token_id == 156895 and model.config.block_size == 32  # the published generate()'s
    loaded = published_state_dict(model)
    for name, tensor in weights.items():
        assert torch.equal(loaded[name], tensor), name
    mask = tiny.block_causal_additive_mask(canvas.shape[1], block_length)
    with torch.no_grad():
        logits = model(canvas, attention_mask=mask).logits[0]
    torch.testing.assert_close(logits, expected, atol=LOGITS_ATOL, rtol=0)


def test_rope_scaling_is_refused():
    fields = {k: v for k, v in tiny.CONFIGS["llada2_moe"].items() if k != "model_type"}
    config = LLaDA2MoeConfig(**{**fields, "rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    with pytest.raises(ValueError, match="rope_scaling=None"):
        LLaDA2MoeModelLM(config)


# ---------------------------------------------------------------------------------------------------------------------
# The published generate() as presets

CASES = {case["name"]: case for case in REFERENCE["cases"]}
PAD = 0


@pytest.fixture(scope="module")
def models() -> dict:
    return {model_type: build(model_type) for model_type in MODEL_TYPES}


def preset_of(case: dict, **fields) -> MaskedDiffusionGenerationConfig:
    """The preset of the case's model type with the published generate()'s arguments of the case."""
    kwargs = {**case["kwargs"], **fields}
    eos_id = kwargs.pop("eos_id")
    preset = MaskedDiffusionGenerationConfig.llada2
    if case["model_type"] == "llada21_moe":
        preset = MaskedDiffusionGenerationConfig.llada21
    return preset(**kwargs, eos_id=eos_id, pad_token_id=PAD, return_dict_in_generate=True)


def published_output(case: dict, generated: list[int]) -> list[int]:
    """What the published generate() returns from hf_mdm's generated columns: up to and including the first EOS
    (after which hf_mdm pads), else all of them."""
    eos_id = case["kwargs"]["eos_id"]
    if eos_id in generated:
        cut = generated.index(eos_id) + 1
        assert set(generated[cut:]) <= {PAD}, "tokens after the first EOS must be padding"
        return generated[:cut]
    return generated


@pytest.mark.parametrize("kv_cache", ["none", "prefix"])
@pytest.mark.parametrize("name", list(CASES))
def test_generate_equals_the_published_generate(models, name, kv_cache):
    case = CASES[name]
    prompt = torch.tensor([case["prompt"]])
    out = models[case["model_type"]].generate(prompt, generation_config=preset_of(case, kv_cache=kv_cache))
    assert out.sequences.shape == (1, prompt.shape[1] + case["kwargs"]["gen_length"])
    assert torch.equal(out.sequences[:, : prompt.shape[1]], prompt)
    assert published_output(case, out.sequences[0, prompt.shape[1] :].tolist()) == case["tokens"]
    assert out.nfe == case["nfe"]


def test_editing_records_the_scores_of_the_last_write(models):
    """output_scores / output_logits with LLaDA2.1's editing: every generated position's scores are those of the
    step that last wrote it, so at temperature 0 their argmax is the final token, edited or not."""
    case = CASES["edit_fires"]
    prompt = torch.tensor([case["prompt"]])
    model = models[case["model_type"]]
    config = preset_of(case, output_scores=True, output_logits=True)
    out = model.generate(prompt, generation_config=config)
    assert torch.equal(out.sequences, model.generate(prompt, generation_config=preset_of(case)).sequences)
    generated = out.sequences[0, prompt.shape[1] :]
    assert len(out.scores) == len(out.logits) == generated.numel()
    for token, scores, logits in zip(generated.tolist(), out.scores, out.logits):
        assert torch.isfinite(logits).all()
        assert int(scores[0].argmax()) == token == int(logits[0].argmax())


def test_recording_the_editing_loops_scores_reads_nothing(models):
    """The editing loop reads one value a step (whether a row still runs); recording its scores adds no read."""
    case = CASES["edit_fires"]
    prompt = torch.tensor([case["prompt"]])
    reads = []
    for record in (False, True):
        with count_host_syncs() as syncs:
            models[case["model_type"]].generate(prompt, generation_config=preset_of(case, output_scores=record))
        reads.append(syncs.total)
    assert reads[0] == reads[1]


def test_the_cases_cover_what_they_say():
    """The reference cases exercise what their names claim (so the equality above tests those paths)."""
    eos = {name: case["kwargs"]["eos_id"] in case["tokens"] for name, case in CASES.items()}
    assert eos["eos_in_block"] and eos["eos_early_stop"] and eos["edit_eos"] and eos["edit_eos_early_stop"]
    assert not any(eos[name] for name in ("short_prompt", "long_prompt", "edit_fires", "edit_never"))
    assert len(CASES["long_prompt"]["prompt"]) > CASES["long_prompt"]["kwargs"]["block_length"]
    # the threshold that always fires reveals a block per forward; the one that never fires takes every step
    assert CASES["threshold_always"]["nfe"] == 3
    assert CASES["threshold_never"]["nfe"] == 3 * 2 + 1  # 3 steps per block, the first block holding 5 prompt tokens
    # editing: with edits a block takes more forwards than its masks need, without edits one more (the last check)
    assert CASES["edit_fires"]["nfe"] > CASES["edit_never"]["nfe"]
    assert CASES["edit_eos_early_stop"]["nfe"] < CASES["edit_eos"]["nfe"]
    # LLaDA2.0's eos_early_stop stops inside the block that reveals EOS: fewer forwards, the same tokens
    assert CASES["eos_early_stop"]["nfe"] < CASES["eos_in_block"]["nfe"]
    assert CASES["eos_early_stop"]["tokens"] == CASES["eos_in_block"]["tokens"]


def test_editing_changes_revealed_tokens(models):
    """LLaDA2.1's editing rewrites tokens: its output differs from the same run with editing off."""
    case = CASES["edit_fires"]
    prompt = torch.tensor([case["prompt"]])
    model = models[case["model_type"]]
    edited = model.generate(prompt, generation_config=preset_of(case)).sequences
    unedited = model.generate(prompt, generation_config=preset_of(case, editing_threshold=1.0)).sequences
    assert not torch.equal(edited, unedited)


def test_eos_early_stop_stops_inside_a_block(models):
    """With eos_early_stop a row stops at the step that reveals EOS with nothing masked before it: the tokens up to
    EOS are those without it, in fewer forwards (some EOS of the tiny model does this)."""
    model, prompt = models["llada2_moe"], torch.tensor([CASES["short_prompt"]["prompt"]])
    settings = dict(gen_length=24, block_length=8, steps=8, threshold=1.0, pad_token_id=PAD)
    plain = model.generate(prompt, generation_config=MaskedDiffusionGenerationConfig.llada2(**settings, eos_id=-1 % 47))
    saved = 0
    for eos_id in sorted(set(plain[0, prompt.shape[1] :].tolist()) - set(prompt[0].tolist())):
        runs = [
            model.generate(
                prompt,
                generation_config=MaskedDiffusionGenerationConfig.llada2(
                    **settings, eos_id=eos_id, eos_early_stop=early, return_dict_in_generate=True
                ),
            )
            for early in (False, True)
        ]
        assert torch.equal(runs[0].sequences, runs[1].sequences)
        saved = max(saved, runs[0].nfe - runs[1].nfe)
        assert runs[1].nfe <= runs[0].nfe
    assert saved > 0


@pytest.mark.parametrize("name", ["short_prompt", "long_prompt", "eos_in_block", "edit_fires", "edit_eos"])
def test_batched_left_padded_rows_equal_rows_alone(models, name):
    case = CASES[name]
    other = CASES["long_prompt" if name != "long_prompt" else "short_prompt"]["prompt"]
    prompts = [case["prompt"], other]
    width = max(map(len, prompts))
    input_ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    model = models[case["model_type"]]
    batched = model.generate(input_ids, attention_mask=attention_mask, generation_config=preset_of(case))
    for row, prompt in enumerate(prompts):
        alone = model.generate(torch.tensor([prompt]), generation_config=preset_of(case))
        assert torch.equal(batched.sequences[row, width:], alone.sequences[0, len(prompt) :]), row
    assert published_output(case, batched.sequences[0, width:].tolist()) == case["tokens"]


def test_exact_cache_is_the_default_and_computes_fewer_positions(models):
    case = CASES["default_block"]
    prompt = torch.tensor([case["prompt"]])
    model = models[case["model_type"]]
    cached = model.generate(prompt, generation_config=preset_of(case))
    uncached = model.generate(prompt, generation_config=preset_of(case, kv_cache="none"))
    assert torch.equal(cached.sequences, uncached.sequences)
    # 2 blocks of 32 (6 prompt + 40 generated positions): without a cache every forward runs all 64 columns; with
    # it the first forward runs the canvas and every later one the current block (the first of a block also the
    # block before it)
    assert uncached.forward_tokens == 64 * case["nfe"]
    assert cached.forward_tokens < uncached.forward_tokens / 1.5


def test_streaming_gives_the_output(models):
    from transformers.generation.streamers import BaseStreamer

    class Collect(BaseStreamer):
        def __init__(self):
            self.tokens: list[int] = []

        def put(self, value):
            self.tokens.extend(value.flatten().tolist())

        def end(self):
            pass

    case = CASES["edit_fires"]
    prompt = torch.tensor([case["prompt"]])
    streamer = Collect()
    models[case["model_type"]].generate(prompt, generation_config=preset_of(case), streamer=streamer)
    assert streamer.tokens == case["prompt"] + case["tokens"]


def test_preset_defaults_are_the_published_ones():
    config = MaskedDiffusionGenerationConfig.llada2()
    assert (config.max_new_tokens, config.block_length, config.steps, config.threshold) == (2048, 32, 32, 0.95)
    assert (config.temperature, config.eos_early_stop, config.transfer) == (0.0, False, "llada2")
    config = MaskedDiffusionGenerationConfig.llada21()
    assert (config.editing_threshold, config.max_post_steps, config.num_to_transfer) == (0.9, 16, 1)
    assert config.threshold == 0.95 and config.finish_at_eos is False
    assert MaskedDiffusionGenerationConfig.llada2(gen_length=64, steps=32, minimal_topk=4).steps == 16
    with pytest.raises(ValueError, match="minimal_topk"):
        MaskedDiffusionGenerationConfig.llada2(gen_length=4, minimal_topk=8)


@pytest.mark.parametrize("name", ["short_prompt", "edit_fires"])
def test_the_family_sampler_is_the_default(models, name):
    """A call that sets no transfer samples as the published generate() with its defaults: the preset's tokens
    with only the length, block and ids given."""
    case = CASES[name]
    prompt = torch.tensor([case["prompt"]])
    model = models[case["model_type"]]
    defaults = {k: v for k, v in case["kwargs"].items() if k in ("gen_length", "block_length", "eos_id")}
    expected = model.generate(prompt, generation_config=preset_of({**case, "kwargs": defaults}))
    got = model.generate(
        prompt,
        max_new_tokens=defaults["gen_length"],
        block_length=defaults["block_length"],
        eos_token_id=defaults["eos_id"],
        pad_token_id=PAD,
        return_dict_in_generate=True,
    )
    assert torch.equal(got.sequences, expected.sequences) and got.nfe == expected.nfe
    other = model.generate(prompt, max_new_tokens=16, block_length=8, transfer="deterministic", steps=16)
    assert other.shape == (1, prompt.shape[1] + 16)  # another transfer takes none of the family's settings


# ---------------------------------------------------------------------------------------------------------------------
# The harness


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory):
    from hf_mdm.harness.tiny import build_tiny_models

    return build_tiny_models(tmp_path_factory.mktemp("tiny"))


def test_harness_runs_llada2_with_its_published_sampler(tiny_checkpoints):
    from lm_eval.api.instance import Instance

    from hf_mdm.harness import MaskedDiffusionLM

    lm = MaskedDiffusionLM(pretrained=tiny_checkpoints["llada2"], device="cpu", batch_size=2)
    assert isinstance(lm.model, LLaDA2MoeModelLM) and lm.reference == "none"
    config = lm.request_configs(16, {})
    assert (config.transfer, config.steps, config.threshold, config.block_length) == ("llada2", 32, 0.95, 32)
    assert config.whole_blocks and config.kv_cache == "prefix"
    prompts = ["Question: 2 + 3?\nAnswer:", "Q: 7 * 6?\nA:"]
    requests = [
        Instance("generate_until", {}, (p, {"max_gen_toks": 16}), i, ("demo", i, 1)) for i, p in enumerate(prompts)
    ]
    batched = lm.generate_until(requests)
    alone = MaskedDiffusionLM(pretrained=tiny_checkpoints["llada2"], device="cpu", batch_size=1).generate_until(
        requests
    )
    assert batched == alone and all(isinstance(text, str) for text in batched)
    tuned = MaskedDiffusionLM(pretrained=tiny_checkpoints["llada2"], device="cpu", threshold=0.5, steps=4)
    config = tuned.request_configs(16, {})
    assert (config.transfer, config.steps, config.threshold) == ("llada2", 4, 0.5)


def test_model_card(models):
    from hf_mdm.hub import llada2_card

    model = models["llada21_moe"]
    results = [dict(metric="accuracy", value=0.25, setting="llada21 defaults", dataset_name="gsm8k")]
    card = llada2_card(model, "someone/tiny-llada21", base_model="inclusionAI/LLaDA2.1-mini", results=results)
    text = str(card)
    assert "LLaDA2.1" in text and "MaskedDiffusionGenerationConfig.llada21(" in text
    assert f"| num_experts | {model.config.num_experts} |" in text and "| editing_threshold | 0.9 |" in text
    assert "| gsm8k | llada21 defaults | accuracy | 0.25 |" in text
    assert card.data.base_model == "inclusionAI/LLaDA2.1-mini" and card.data.eval_results[0].metric_value == 0.25
    with pytest.raises(ValueError, match="LLaDA2.x"):
        llada2_card(SimpleNamespace(config=SimpleNamespace(model_type="Dream")), "x/y")


def test_diffusion_gemma_is_timed_through_its_own_generate(tiny_checkpoints):
    """``hf_diffusion_gemma`` returns what DiffusionGemma's own generate() writes, and counts its decoder forwards."""
    from lm_eval.api.instance import Instance
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from hf_mdm.harness.models import DiffusionGemmaLM

    lm = DiffusionGemmaLM(pretrained=tiny_checkpoints["diffusion_gemma"], device="cpu", max_denoising_steps=4)
    prompt = "Q: 2 + 3?\nA:"
    request = Instance("generate_until", {}, (prompt, {"max_gen_toks": 16, "until": ["\n\n"]}), 0, ("demo", 0, 1))
    torch.manual_seed(0)  # DiffusionGemma samples (its temperature schedule) from torch's global generator
    (text,) = lm.generate_until([request])
    (record,) = lm.timing.records
    assert 1 <= record.nfe <= 4  # one canvas of 16 tokens, at most max_denoising_steps decoder forwards
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoints["diffusion_gemma"])
    model = AutoModelForImageTextToText.from_pretrained(tiny_checkpoints["diffusion_gemma"]).eval()
    input_ids = tokenizer(prompt, return_tensors="pt").input_ids
    torch.manual_seed(0)
    own = model.generate(input_ids, max_new_tokens=16, max_denoising_steps=4, pad_token_id=tokenizer.pad_token_id)
    expected = tokenizer.decode(own.sequences[0, input_ids.shape[1] :], skip_special_tokens=True).split("\n\n")[0]
    assert text == expected
    with pytest.raises(ValueError, match="DiffusionGemma checkpoints"):
        DiffusionGemmaLM(pretrained=tiny_checkpoints["llada2"], device="cpu")


def test_remasking_on_llada2_takes_none_of_the_family_settings(models):
    model, prompt = models["llada2_moe"], torch.tensor([CASES["short_prompt"]["prompt"]])
    out = model.generate(
        prompt, max_new_tokens=16, block_length=8, steps=8, remdm="rescale", remdm_eta=0.1, seed=0, temperature=1.0
    )
    assert out.shape == (1, prompt.shape[1] + 16) and not bool((out == tiny.MASK_ID).any())
