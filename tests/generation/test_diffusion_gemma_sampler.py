"""hf_mdm's uniform-corruption sampler (`hf_mdm.generation_uniform`) against transformers' own DiffusionGemma
``generate()`` and diffusers' ``DiffusionGemmaPipeline``, on a tiny random DiffusionGemma.

The tiny model is the harness's (`hf_mdm.harness.tiny`: its text and vision sizes) with 64 tokens, canvases of 8
and an LM head scaled up, so that token entropies spread around the entropy bound: the number of positions a step
accepts varies, rows stop early at different steps, and a wrong sampler gives other tokens.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from tiny_mdm import tiny_mdm
from transformers import (
    DiffusionGemmaConfig,
    DiffusionGemmaForBlockDiffusion,
    LogitsProcessorList,
    SuppressTokensLogitsProcessor,
)
from transformers.models.diffusion_gemma import generation_diffusion_gemma as dg

from hf_mdm import generation_uniform as uniform
from hf_mdm.families import facts_of
from hf_mdm.generation import MaskedDiffusionGenerationConfig, diffusion_generate
from hf_mdm.generation_random import draw_one, first_argmax
from hf_mdm.harness.tiny import TINY_DIFFUSION_GEMMA_TEXT, TINY_VISION

VOCAB, CANVAS, PAD = 64, 8, 0
SETTINGS = dict(max_new_tokens=20, max_denoising_steps=8, entropy_bound=0.5, t_min=0.4, t_max=0.8)


def tiny_diffusion_gemma() -> DiffusionGemmaForBlockDiffusion:
    """The harness's tiny DiffusionGemma sizes, 64 tokens, canvases of 8, the LM head scaled by 12; seeded with 0."""
    torch.manual_seed(0)
    special = dict(eos_token_id=1, bos_token_id=2, pad_token_id=PAD)
    config = DiffusionGemmaConfig(
        text_config={**TINY_DIFFUSION_GEMMA_TEXT, "vocab_size": VOCAB, **special},
        vision_config=TINY_VISION,
        canvas_length=CANVAS,
        **special,
    )
    model = DiffusionGemmaForBlockDiffusion(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(12.0)  # tied to the embeddings
    return model


@pytest.fixture(scope="module")
def model() -> DiffusionGemmaForBlockDiffusion:
    return tiny_diffusion_gemma()


def prompts(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` prompts of 5 tokens; rows after the first are left-padded by 1, 2, ... positions."""
    ids = torch.randint(3, VOCAB, (batch, 5), generator=torch.Generator().manual_seed(batch))
    mask = torch.ones_like(ids)
    for row in range(1, batch):
        mask[row, : min(row, 4)] = 0
    return ids.masked_fill(mask == 0, PAD), mask


@contextlib.contextmanager
def patched(owner, name, value):
    """``owner.name = value`` for the block, then as it was."""
    own, old = name in vars(owner), vars(owner).get(name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old) if own else delattr(owner, name)


@contextlib.contextmanager
def recording(model):
    """Counts the model's forwards and, in transformers' sampler, the positions each step accepts."""
    record: dict[str, Any] = {"forwards": 0, "accepted": []}
    forward, accept = model.forward, dg.EntropyBoundSampler.accept_canvas

    def counted(*args, **kwargs):
        record["forwards"] += 1
        return forward(*args, **kwargs)

    def accepting(self, *args):
        canvas = accept(self, *args)
        record["accepted"].extend(self.accepted_token_mask.sum(-1).tolist())
        return canvas

    with patched(model, "forward", counted), patched(dg.EntropyBoundSampler, "accept_canvas", accepting):
        yield record


def transformers_generate(model, ids, mask, seed, entropy_bound, **settings):
    """transformers' generate under ``torch.manual_seed(seed)``: (sequences, per-row decoder forwards, record)."""
    torch.manual_seed(seed)
    sampler = dg.EntropyBoundSamplerConfig(entropy_bound=float(entropy_bound))
    with recording(model) as record:
        out = model.generate(ids, attention_mask=mask, sampler_config=sampler, pad_token_id=PAD, **settings)
    new = out.sequences[:, ids.shape[1] :]
    row_forwards = ((new != PAD).sum(-1) / out.tokens_per_forward).round().long()
    return out.sequences, row_forwards, record


def hf_mdm_generate(model, ids, mask, seed, confidence_threshold=0.005, **settings):
    """hf_mdm's diffusion_generate with ``seed``; transformers' ``confidence_threshold=None`` is 0 here."""
    off = confidence_threshold is None
    settings["confidence_threshold"] = 0 if off else confidence_threshold
    return diffusion_generate(
        model, ids, attention_mask=mask, seed=seed, pad_token_id=PAD, return_dict_in_generate=True, **settings
    )


CASES = {
    "batch1-3canvases": dict(batch=1, confidence_threshold=0.5),
    "padded-batch3-3canvases": dict(batch=3, confidence_threshold=0.5),
    "padded-batch3-stop-off": dict(batch=3, confidence_threshold=None, max_new_tokens=16),
    "stability0": dict(batch=3, confidence_threshold=0.5, stability_threshold=0),
    "stability2": dict(batch=3, confidence_threshold=0.8, stability_threshold=2, max_new_tokens=24),
    "hot-schedule": dict(
        batch=3, confidence_threshold=1.0, stability_threshold=0, t_min=0.1, t_max=1.5, max_denoising_steps=5
    ),
    "cold-schedule": dict(batch=2, confidence_threshold=0.2, t_min=0.0, t_max=0.5, max_denoising_steps=12),
    "transformers-defaults": dict(batch=3, entropy_bound=0.1, confidence_threshold=0.005, max_new_tokens=12),
    "padded-batch4": dict(batch=4, confidence_threshold=0.5),
}


@pytest.mark.parametrize("case", list(CASES))
def test_token_exact_against_transformers(model, case):
    settings = {**SETTINGS, **CASES[case]}
    ids, mask = prompts(settings.pop("batch"))
    early = 0
    for seed in range(2):
        expected, row_forwards, record = transformers_generate(model, ids, mask, seed, **settings)
        out = hf_mdm_generate(model, ids, mask, seed, stop_at_eos=False, **settings)
        assert torch.equal(out.sequences, expected), (case, seed)
        assert torch.equal(out.row_nfe, row_forwards), (case, seed)
        assert out.nfe == record["forwards"]
        canvases = (expected.shape[1] - ids.shape[1]) // CANVAS
        early += int((row_forwards < canvases * settings["max_denoising_steps"]).sum())
    if settings["confidence_threshold"] is None:
        assert early == 0
    elif case != "transformers-defaults":  # 0.005 rarely fires on this model
        assert early > 0, "the adaptive stop never fired: the case would not test it"


def test_step_helpers_are_torchs_operations_to_the_bit():
    """The sampler's step helpers give the bits of the torch calls transformers makes: `draw_one` the indices of
    ``torch.multinomial(probs, 1)`` and leaves the generator where it does, `token_entropy` the entropies of
    ``Categorical(logits=...).entropy()``, `first_argmax` the indices of ``torch.argmax`` (ties to the first, NaN
    as the largest, -inf rows)."""
    logits = torch.randn(6, 32, 50, generator=torch.Generator().manual_seed(0)) * 6
    logits[0, :, 10:40] = float("-inf")  # suppressed tokens: zero probabilities
    probs = torch.softmax(logits, dim=-1).view(-1, 50)
    for seed in range(3):
        ours, theirs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        drawn = draw_one(probs, ours)
        assert torch.equal(drawn, torch.multinomial(probs, 1, generator=theirs).squeeze(-1))
        assert torch.equal(torch.rand(4, generator=ours), torch.rand(4, generator=theirs))
    expected = torch.distributions.Categorical(logits=logits).entropy()
    assert torch.equal(uniform.token_entropy(logits.clone()), expected)
    ties = torch.randint(-2, 2, (64, 300), generator=torch.Generator().manual_seed(1)).float()
    ties[0, 7], ties[1, 3], ties[2] = float("nan"), float("nan"), float("-inf")
    assert torch.equal(first_argmax(ties), torch.argmax(ties, dim=-1))


def test_the_decoder_is_called_as_the_models_forward_calls_it(model):
    """`CanvasModel.decode` calls the decoder and the LM head of a plain DiffusionGemmaForBlockDiffusion itself (the
    same logits as the model's forward), and the model's forward when it is hooked or patched; the tokens equal
    transformers' either way, at batch 1 and on a left-padded batch of 4."""
    ids, mask = prompts(4)
    calls = uniform.CanvasModel(model)
    assert calls._decoder is model.model.decoder
    calls.encode(ids, mask.bool())
    canvas = calls.random_canvas(4, ids.device, torch.Generator().manual_seed(0))
    conditioning = calls.decode(canvas, None)
    inputs = dict(decoder_attention_mask=calls._mask, decoder_position_ids=calls._positions)
    inputs[calls._cache] = calls.cache  # past_key_values in transformers 5.15, cache in 5.24
    expected = model(decoder_input_ids=canvas, self_conditioning_logits=conditioning, **inputs).logits
    assert torch.equal(calls.decode(canvas, conditioning), expected)
    handle = model.register_forward_pre_hook(lambda module, args: None)
    try:
        assert uniform.CanvasModel(model)._decoder is None
        with patched(model, "forward", model.forward):
            assert uniform.CanvasModel(model)._decoder is None
        for batch in (1, 4):
            hooked = hf_mdm_generate(model, ids[:batch], mask[:batch], 3, **SETTINGS).sequences
            assert torch.equal(hooked, transformers_generate(model, ids[:batch], mask[:batch], 3, **SETTINGS)[0])
    finally:
        handle.remove()
    for batch in (1, 4):
        plain = hf_mdm_generate(model, ids[:batch], mask[:batch], 3, **SETTINGS).sequences
        assert torch.equal(plain, transformers_generate(model, ids[:batch], mask[:batch], 3, **SETTINGS)[0])


def test_max_length_counts_the_prompt(model):
    """transformers' ``max_length`` (unset ``max_new_tokens``): new tokens = max_length - P, in whole canvases."""
    ids, mask = prompts(2)
    settings = {name: value for name, value in SETTINGS.items() if name != "max_new_tokens"}
    expected, row_forwards, _ = transformers_generate(model, ids, mask, 0, max_length=17, **settings)
    out = hf_mdm_generate(model, ids, mask, 0, max_length=17, stop_at_eos=False, **settings)
    assert torch.equal(out.sequences, expected) and torch.equal(out.row_nfe, row_forwards)
    assert expected.shape[1] == ids.shape[1] + 2 * CANVAS


def test_logits_processors_run_before_the_temperature(model):
    """A user's processors see the (B, C, V) logits before the temperature, as in transformers (which appends its
    temperature to the list it is given: each call gets its own list)."""
    ids, mask = prompts(2)
    processors = lambda: LogitsProcessorList([SuppressTokensLogitsProcessor(list(range(10, 40)))])
    expected, _, _ = transformers_generate(model, ids, mask, 0, logits_processor=processors(), **SETTINGS)
    out = diffusion_generate(
        model, ids, attention_mask=mask, logits_processor=processors(), seed=0, stop_at_eos=False, **SETTINGS
    )
    assert torch.equal(out.sequences, expected) and not ((expected[:, 5:] >= 10) & (expected[:, 5:] < 40)).any()


def test_acceptance_varies_and_the_bound_matters(model):
    """The entropy bound decides: the positions accepted per step vary, and another bound gives other tokens."""
    ids, mask = prompts(3)
    expected, _, record = transformers_generate(model, ids, mask, 0, **SETTINGS)
    accepted = record["accepted"]
    assert len(set(accepted)) >= 6 and min(accepted) <= 2 and max(accepted) == CANVAS
    same = hf_mdm_generate(model, ids, mask, 0, **SETTINGS, stop_at_eos=False)
    other = hf_mdm_generate(model, ids, mask, 0, **{**SETTINGS, "entropy_bound": 0.05}, stop_at_eos=False)
    assert torch.equal(same.sequences, expected) and not torch.equal(other.sequences, expected)
    assert not torch.equal(hf_mdm_generate(model, ids, mask, 1, **SETTINGS, stop_at_eos=False).sequences, expected)


def test_eos_padding(model):
    """An EOS the model writes in the first canvas: the tokens after it and the row's later canvases are padding,
    and a batch whose rows all finished stops."""
    ids, mask = prompts(3)
    free, _, _ = transformers_generate(model, ids, mask, 0, **SETTINGS)
    eos = int(free[0, ids.shape[1] + 2])
    assert eos != PAD
    for batch in (3, 1):
        expected, row_forwards, _ = transformers_generate(
            model, ids[:batch], mask[:batch], 0, eos_token_id=eos, **SETTINGS
        )
        out = hf_mdm_generate(model, ids[:batch], mask[:batch], 0, eos_token_id=eos, **SETTINGS)
        assert torch.equal(out.sequences, expected) and torch.equal(out.row_nfe, row_forwards)
        first = ids.shape[1] + int((expected[0, ids.shape[1] :] == eos).nonzero()[0])
        assert (expected[0, first + 1 :] == PAD).all() and expected.shape[1] > first + 1
        assert torch.equal(out.num_generated_tokens, (expected[:, ids.shape[1] :] != PAD).sum(-1))
    assert expected.shape[1] == ids.shape[1] + CANVAS  # the only row finished in the first canvas


def test_ids_come_from_the_generation_config_as_in_transformers(model):
    """transformers reads the EOS and pad ids from the generation config only (the call's, the model's): with a
    generation config that names none, it runs every canvas and pads nothing, although the model config names EOS 1
    and pad 0; so does hf_mdm, the preset as README calls it included. An EOS that the call or the model's
    generation config names stops both, after the same canvases."""
    ids, mask = prompts(1)
    settings = {**SETTINGS, "max_new_tokens": 24}
    bound = dg.EntropyBoundSamplerConfig(entropy_bound=settings.pop("entropy_bound"))
    assert model.generation_config.eos_token_id is None and model.config.eos_token_id == 1
    torch.manual_seed(2)
    expected = model.generate(ids, attention_mask=mask, sampler_config=bound, **settings).sequences
    assert expected.shape[1] == ids.shape[1] + 24 and (expected[0, ids.shape[1] : -CANVAS] == 1).any()
    preset = MaskedDiffusionGenerationConfig.diffusion_gemma(**settings, entropy_bound=bound.entropy_bound)
    ours = diffusion_generate(model, ids, attention_mask=mask, generation_config=preset, seed=2)
    assert torch.equal(ours.sequences, expected)
    named = dict(eos_token_id=1, pad_token_id=PAD)
    torch.manual_seed(2)
    stopped = model.generate(ids, attention_mask=mask, sampler_config=bound, **settings, **named).sequences
    assert stopped.shape[1] < expected.shape[1] and stopped[0, -1] == PAD
    ours = diffusion_generate(model, ids, attention_mask=mask, generation_config=preset, seed=2, **named)
    assert torch.equal(ours.sequences, stopped)
    with patched(model, "generation_config", dg.DiffusionGemmaGenerationConfig(**named)):
        ours = diffusion_generate(model, ids, attention_mask=mask, generation_config=preset, seed=2)
    assert torch.equal(ours.sequences, stopped)


def test_preset_reproduces_transformers_defaults_and_semantics(model):
    defaults = dg.DiffusionGemmaGenerationConfig._get_default_generation_params()
    preset = MaskedDiffusionGenerationConfig.diffusion_gemma()
    for name, value in defaults.items():
        value = value.entropy_bound if name == "sampler_config" else value
        assert getattr(preset, "entropy_bound" if name == "sampler_config" else name) == value, name
    ids, mask = prompts(3)
    for confidence in (0.5, None):
        settings = {**SETTINGS, "confidence_threshold": confidence}
        expected, row_forwards, _ = transformers_generate(model, ids, mask, 2, **settings)
        config = MaskedDiffusionGenerationConfig.diffusion_gemma(
            **settings, pad_token_id=PAD, stop_at_eos=False, return_dict_in_generate=False
        )
        out = diffusion_generate(model, ids, attention_mask=mask, generation_config=config, seed=2)
        assert torch.equal(out, expected)
    generator = torch.Generator().manual_seed(2)
    out = diffusion_generate(model, ids, attention_mask=mask, generation_config=config, generator=generator)
    assert torch.equal(out, expected)


def test_family_facts_and_streamer(model):
    assert facts_of(model).corruption == "uniform" and facts_of(tiny_mdm()).corruption == "mask"
    ids, mask = prompts(1)

    class Streamer:
        def __init__(self):
            self.put_calls, self.drafts, self.ended = [], 0, False

        def put(self, value):
            self.put_calls.append(value)

        def put_draft(self, value):
            self.drafts += 1

        def end(self):
            self.ended = True

    streamer = Streamer()
    out = diffusion_generate(model, ids, seed=0, streamer=streamer, stop_at_eos=False, **SETTINGS).sequences
    assert streamer.ended and torch.equal(torch.cat(streamer.put_calls, -1), out)
    assert len(streamer.put_calls) == 1 + 3 and streamer.drafts >= 3


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(steps=4), r"steps=4: setting\(s\) of the masked diffusion sampler"),
        (dict(temperature=0.7), r"temperature=0.7"),
        (dict(transfer="stochastic", strategy="random"), r"transfer='stochastic', strategy='random'"),
        (dict(kv_cache="prefix"), r"kv_cache='prefix'"),
        (dict(output_scores=True), r"output_scores=True"),
        (dict(t_min=0.8, t_max=0.4), r"t_max must be > t_min"),
        (dict(max_denoising_steps=0), r"max_denoising_steps must be an integer >= 1"),
        (dict(confidence_threshold=-1.0), r"confidence_threshold must be a number >= 0"),
        (dict(stability_threshold=1.5), r"stability_threshold must be an integer >= 0"),
        (dict(seed=[0, 1]), r"one seed per row is not supported"),
    ],
)
def test_clear_errors_on_a_uniform_model(model, settings, message):
    ids, mask = prompts(2)
    settings = {"seed": 0, **settings}
    with pytest.raises(ValueError, match=message):
        diffusion_generate(model, ids, attention_mask=mask, max_new_tokens=8, **settings)


@pytest.mark.parametrize("name, value", [("t_min", 0.3), ("max_denoising_steps", 8), ("confidence_threshold", 0.1)])
def test_uniform_settings_on_a_masked_model_are_errors(name, value):
    with pytest.raises(ValueError, match=rf"{name}={value}: settings of the uniform-corruption sampler"):
        diffusion_generate(tiny_mdm(), torch.tensor([[1, 2, 3]]), max_new_tokens=4, steps=2, **{name: value})


# ----------------------------------------------------------------------------------------------------------------
# diffusers' DiffusionGemmaPipeline (diffusers 0.42.1) with its EntropyBoundScheduler
# ----------------------------------------------------------------------------------------------------------------


class Processor:
    """What the pipeline's ``_prepare_inputs`` reads from a processor: ``apply_chat_template`` returning ids."""

    def __init__(self, ids, mask):
        self.ids, self.mask = ids, mask

    def apply_chat_template(self, messages, **kwargs):
        return {"input_ids": self.ids, "attention_mask": self.mask}


def pipeline(model, ids, mask, t_min, t_max):
    diffusers = pytest.importorskip("diffusers")
    scheduler = diffusers.EntropyBoundScheduler(entropy_bound=SETTINGS["entropy_bound"], t_min=t_min, t_max=t_max)
    pipe = diffusers.DiffusionGemmaPipeline(model=model, scheduler=scheduler, processor=Processor(ids, mask))
    pipe.set_progress_bar_config(disable=True)
    return pipe


@contextlib.contextmanager
def cache_keyword(model):
    """The pipeline passes ``past_key_values=`` to the decoder's ``create_diffusion_decoder_attention_mask``, which
    transformers 5.24 names ``cache``: translated here so the pipeline runs."""
    decoder = model.model.decoder
    make = type(decoder).create_diffusion_decoder_attention_mask
    decoder.create_diffusion_decoder_attention_mask = lambda past_key_values=None, cache=None, **kwargs: make(
        cache=past_key_values if cache is None else cache, **kwargs
    )
    try:
        yield
    finally:
        del decoder.create_diffusion_decoder_attention_mask


def traced(model, run):
    """The canvas and self-conditioning logits of every decoder forward of ``run()``, the canvases transformers'
    denoising steps return (the canvas a next step would read), and ``run()``'s result."""
    forwards, returned, forward, step = [], [], model.forward, model._denoising_step

    def recorded(*args, **kwargs):
        forwards.append((kwargs["decoder_input_ids"].clone(), kwargs.get("self_conditioning_logits")))
        return forward(*args, **kwargs)

    def stepped(*args, **kwargs):
        outputs = step(*args, **kwargs)
        returned.append(outputs[0].clone())
        return outputs

    with patched(model, "forward", recorded), patched(model, "_denoising_step", stepped):
        result = run()
    return forwards, returned, result


def test_diffusers_pipeline_differs_from_transformers(model):
    """diffusers' pipeline is not transformers' generate: (1) unpatched it does not run with transformers 5.24
    (``past_key_values=`` to the decoder's mask builder); (2) it appends the scheduler's last canvas (accepted drafts
    and the random tokens renoised at the last step) where transformers appends the argmax, so from the first canvas
    on the tokens differ; (3) its temperature is computed in float64 (transformers': float32 tensors), so its
    logits differ by an ulp at some steps of the default schedule. With a dyadic schedule (exact in both) every
    decoder forward of the first canvas reads the same canvas and self-conditioning logits as transformers', and
    the canvas the pipeline appends is the one transformers' last step returns (and discards)."""
    ids, mask = prompts(3)
    pipe = pipeline(model, ids, mask, 0.5, 1.0)
    call = dict(prompt=["-"] * 3, gen_length=SETTINGS["max_new_tokens"], num_inference_steps=8, output_type="seq")
    call.update(eos_early_stop=False, confidence_threshold=None)
    with pytest.raises(TypeError, match="past_key_values"):
        pipe(**call, generator=torch.Generator().manual_seed(0))
    settings = {**SETTINGS, "confidence_threshold": None, "t_min": 0.5, "t_max": 1.0}
    first, differ = SETTINGS["max_denoising_steps"], 0  # the forwards of the first canvas
    for seed in range(2):
        with cache_keyword(model):
            theirs, _, out = traced(model, lambda: pipe(**call, generator=torch.Generator().manual_seed(seed)))
        ours, canvases, (expected, _, _) = traced(
            model, lambda: transformers_generate(model, ids, mask, seed, **settings)
        )
        for (canvas, conditioning), (canvas_t, conditioning_t) in zip(theirs[:first], ours[:first]):
            assert torch.equal(canvas, canvas_t)
            assert conditioning is conditioning_t is None or torch.equal(conditioning, conditioning_t)
        appended = out.sequences[:, :CANVAS]
        assert torch.equal(appended, canvases[first - 1])
        differ += int(not torch.equal(appended, expected[:, ids.shape[1] : ids.shape[1] + CANVAS]))
    assert differ > 0
    # the default schedule 0.4 -> 0.8: float64 and float32 temperatures differ at some steps
    steps = 8
    float32 = [0.4 + (0.8 - 0.4) * (torch.tensor(n, dtype=torch.int32) / steps) for n in range(steps, 0, -1)]
    float64 = [0.4 + (0.8 - 0.4) * ((steps - i) / steps) for i in range(steps)]
    assert any(float(t32) != float(torch.tensor(t64, dtype=torch.float32)) for t32, t64 in zip(float32, float64))


def test_a_checkpoints_generation_config_is_read(model, tmp_path):
    """A DiffusionGemma checkpoint's generation_config.json (its bound inside ``sampler_config``, its steps and
    temperature schedule) is what both samplers run when the call names nothing."""
    saved = dg.DiffusionGemmaGenerationConfig(
        max_new_tokens=16, max_denoising_steps=6, t_min=0.3, t_max=0.9, stability_threshold=1,
        confidence_threshold=0.5, sampler_config=dg.EntropyBoundSamplerConfig(entropy_bound=0.3),
        eos_token_id=1, pad_token_id=PAD,
    )  # fmt: skip
    saved.save_pretrained(tmp_path)
    loaded = dg.DiffusionGemmaGenerationConfig.from_pretrained(tmp_path)
    ids, mask = prompts(2)
    with patched(model, "generation_config", loaded):
        torch.manual_seed(5)
        expected = model.generate(ids, attention_mask=mask).sequences
        ours = diffusion_generate(model, ids, attention_mask=mask, seed=5)
    assert torch.equal(ours.sequences, expected)
    with pytest.raises(ValueError, match="names no entropy_bound"):
        from transformers import GenerationConfig

        MaskedDiffusionGenerationConfig.from_any(GenerationConfig(sampler_config={"bound": 0.3}, max_new_tokens=8))
