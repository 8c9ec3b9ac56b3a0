"""``compile_forward``: the model call compiled with torch.compile gives the eager tokens for every sampler, compiles
a bounded number of graphs per call (not one per step), is kept on the model across calls, and is refused with a
clear error for values that cannot run."""

import llada2_tiny as tiny
import pytest
import torch
from tiny_mdm import MASK, tiny_mdm
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.testing import CompileCounter
from transformers import AutoConfig, AutoModel, CompileConfig

from hf_mdm import MaskedDiffusionGenerationConfig, MDMForMaskedDiffusion
from hf_mdm.generation_denoiser import compile_options
from hf_mdm.generation_strategy import Proposer
from hf_mdm.harness.sampler_config import RequestConfigs, check_reference_args

MAX_GRAPHS = 6  # graphs one generate call may compile: a few argument sets (cache, no cache), never one per step


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each case compiles from scratch (dynamo's per-function graph limit is shared by every test otherwise)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _mdm(block_size=None) -> MDMForMaskedDiffusion:
    return tiny_mdm(block_size, sharpen=20)  # sharp confidences: tokens that do not hinge on last-bit ties


@pytest.fixture(scope="module")
def models() -> dict:
    built = {"mdm": _mdm(), "block_causal": _mdm(block_size=4)}
    for model_type in tiny.CONFIGS:
        config = AutoConfig.for_model(
            **tiny.CONFIGS[model_type], mask_token_id=tiny.MASK_ID, eos_token_id=tiny.MASK_ID - 1
        )
        built[model_type] = AutoModel.from_config(config).eval()
        tiny.fill_weights(built[model_type], tiny.SEEDS[model_type])
    return built


BASE = dict(max_new_tokens=12, steps=8, block_length=4)
# (model, settings): every registered transfer and strategy, the adaptive rules, speculative decoding, remasking,
# guidance, the caches, sampling at temperature > 0 and the reference presets
CASES = {
    **{f"deterministic-{s}": ("mdm", dict(BASE, strategy=s)) for s in ("confidence", "margin", "entropy")},
    **{f"deterministic-{s}": ("mdm", dict(BASE, strategy=s)) for s in ("random", "left_to_right")},
    "stochastic-random": ("mdm", dict(BASE, transfer="stochastic", strategy="random")),
    "stochastic-confidence": ("mdm", dict(BASE, transfer="stochastic")),
    "threshold": ("mdm", dict(BASE, transfer="threshold", threshold=0.6, steps=None)),
    "entropy_bound": ("mdm", dict(BASE, transfer="entropy_bound", entropy_bound=0.5, strategy="entropy")),
    "speculative": ("mdm", dict(max_new_tokens=10, transfer="speculative", draft_length=3)),
    "remdm-cap": ("mdm", dict(BASE, remdm="cap", remdm_eta=0.3)),
    "remdm-loop": ("mdm", dict(BASE, remdm="loop", remdm_eta=0.5, remdm_t_on=0.7, remdm_t_off=0.3)),
    "cfg": ("mdm", dict(BASE, cfg_scale=1.5)),
    "kv_cache-dual": ("mdm", dict(BASE, kv_cache="dual")),
    "temperature": ("mdm", dict(BASE, temperature=0.8, top_k=10)),
    "block_causal": ("block_causal", dict(BASE)),
    "llada": ("mdm", MaskedDiffusionGenerationConfig.llada(12, 6, 4)),
    "dream": ("mdm", MaskedDiffusionGenerationConfig.dream(12, 6, alg="entropy")),
    "llada2": ("llada2_moe", MaskedDiffusionGenerationConfig.llada2(16, 8, 4, threshold=0.9)),
    "llada21": ("llada21_moe", MaskedDiffusionGenerationConfig.llada21(16, 8, threshold=0.7, editing_threshold=0.5)),
}


def _generate(model, settings, seed: int = 3, **fields):
    prompt = torch.randint(1, 28, (2, 5), generator=torch.Generator().manual_seed(1))
    if isinstance(settings, MaskedDiffusionGenerationConfig):
        return model.generate(prompt, generation_config=settings, seed=seed, return_dict_in_generate=True, **fields)
    return model.generate(prompt, **settings, **fields, seed=seed, return_dict_in_generate=True)


@pytest.mark.parametrize("name", list(CASES))
def test_compiled_tokens_equal_eager_tokens(models, name):
    model_name, settings = CASES[name]
    model = models[model_name]
    eager = _generate(model, settings)
    counter = CompileCounter()
    compiled = _generate(model, settings, compile_forward=True, compile_config=CompileConfig(backend=counter))
    assert torch.equal(compiled.sequences, eager.sequences)
    assert compiled.nfe == eager.nfe
    assert 1 <= counter.frame_count <= MAX_GRAPHS, f"{counter.frame_count} graphs for {eager.nfe} forwards"
    off = _generate(
        model, settings, compile_forward=True, compile_config=CompileConfig(backend=counter), disable_compile=True
    )
    assert torch.equal(off.sequences, eager.sequences)


def test_compiled_forward_is_kept_on_the_model_across_calls(models):
    model = _mdm()
    counter = CompileCounter()
    options = dict(compile_forward=True, compile_config=CompileConfig(backend=counter))
    first = _generate(model, BASE, **options)
    graphs = counter.frame_count
    second = _generate(model, dict(BASE, steps=12), **options)  # other step counts: the same graphs
    assert graphs >= 1 and counter.frame_count == graphs
    assert first.nfe == 8 and second.nfe == 12
    assert not hasattr(_mdm(), "_hf_mdm_compiled_forwards")  # kept per model, not globally


def test_the_steps_proposals_are_compiled_too(models):
    """The switch compiles the step's proposals (processors, softmax, the token drawn) besides the model call:
    dynamo holds graphs for `Proposer._propose` after a compiled call, none after an eager one."""
    graphs = lambda: len(_debug_get_cache_entry_list(Proposer._propose.__code__))  # noqa: E731
    _generate(models["mdm"], dict(BASE, temperature=0.8, top_k=10))
    assert graphs() == 0
    counter = CompileCounter()
    _generate(
        models["mdm"],
        dict(BASE, temperature=0.8, top_k=10),
        compile_forward=True,
        compile_config=CompileConfig(backend=counter),
    )
    assert graphs() >= 1


def test_disable_compile_runs_the_model_eagerly(models):
    counter = CompileCounter()
    _generate(
        models["mdm"], BASE, compile_forward=True, compile_config=CompileConfig(backend=counter), disable_compile=True
    )
    assert counter.frame_count == 0


def test_compile_options_default_to_dynamic_inductor():
    config = MaskedDiffusionGenerationConfig(compile_forward=True)
    assert compile_options(config) == {"dynamic": True, "fullgraph": False, "backend": "inductor"}
    assert compile_options(MaskedDiffusionGenerationConfig()) is None
    given = CompileConfig(fullgraph=True, dynamic=False, mode="max-autotune-no-cudagraphs")
    options = compile_options(MaskedDiffusionGenerationConfig(compile_forward=True, compile_config=given))
    assert options == {"dynamic": False, "fullgraph": True, "backend": "inductor", "mode": "max-autotune-no-cudagraphs"}
    eager = CompileConfig(backend="eager")  # CompileConfig's default mode (reduce-overhead) is inductor's only
    assert "mode" not in compile_options(MaskedDiffusionGenerationConfig(compile_forward=True, compile_config=eager))


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(compile_forward="yes"), "compile_forward must be True or False"),
        (
            dict(compile_forward=True, compile_config={"dynamic": True}),
            "instance of `CompileConfig`|must be a transformers.CompileConfig",
        ),
        (dict(compile_config=CompileConfig()), "set compile_forward=True"),
        (dict(compile_forward=True, compile_config=CompileConfig(backend="nope")), "unknown torch.compile backend"),
        # CompileConfig's default mode replays CUDA graphs: refused on a CPU model (with or without a cache)
        (dict(compile_forward=True, compile_config=CompileConfig(), kv_cache="prefix"), "need the model on a CUDA"),
        (dict(compile_forward=True, compile_config=CompileConfig()), "move the model to CUDA, or use mode='default'"),
    ],
)
def test_bad_compile_settings_say_what_to_change(models, fields, message):
    with pytest.raises(ValueError, match=message):
        _generate(models["mdm"], BASE, **fields)


def test_inductor_tokens_equal_eager_tokens(models):
    """The default backend (inductor, dynamic shapes) on the default sampler: the same tokens and forwards (inductor
    needs a C++ compiler on the CPU: `make system-deps` installs one)."""
    eager = _generate(models["mdm"], BASE)
    compiled = _generate(models["mdm"], BASE, compile_forward=True)
    assert torch.equal(compiled.sequences, eager.sequences) and compiled.nfe == eager.nfe


@pytest.mark.parametrize("reference", ["none", "llada", "dream"])
def test_lm_eval_model_argument_reaches_every_sampler(reference):
    """``compile_forward`` is how the model runs, not how it samples: the reference samplers take it too."""
    check_reference_args("llada", {"compile_forward": True}, "model arguments")  # no ValueError
    base = MaskedDiffusionGenerationConfig(mask_token_id=MASK, compile_forward=True)
    config = RequestConfigs(reference, base, {"compile_forward": True}, [], 0)(8, {})
    assert config.compile_forward is True
    assert config.reference == (None if reference == "none" else reference)
