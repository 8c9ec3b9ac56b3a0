"""Bad input at the public entry points: one table per entry point of input -> the ValueError (or, for the command
lines, the error message) that names the field and the fix, raised before any forward pass."""

import json
import os
import re
from pathlib import Path

import pytest
import torch
from tiny_mdm import tiny_mdm
from transformers.generation.streamers import BaseStreamer

from hf_mdm.generation import MaskedDiffusionGenerationConfig, diffusion_generate

os.environ.setdefault("HF_MDM_DATA_DIR", str(Path(__file__).resolve().parents[2] / "shared" / "data"))

VOCAB, MASK = 17, 16
PROMPT = torch.tensor([[1, 2, 3]])


@pytest.fixture(scope="module")
def model():
    return tiny_mdm(
        vocab_size=VOCAB, mask_token_id=MASK, num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=64
    )


@pytest.fixture
def forwards(model):
    """Counts the model's forward passes during a test."""
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    yield calls
    handle.remove()


# -- generate(): settings --------------------------------------------------------------------------------------------

GENERATE_KWARGS = [
    # the cases
    (dict(mask_token_id=VOCAB), "mask_token_id=17 is outside the model's vocabulary"),
    (dict(top_k=-3), "top_k must be an integer >= 0"),
    (dict(top_k=-3, temperature=1.0), "top_k must be an integer >= 0"),
    (dict(remasking="nope"), r"remasking must be one of \['low_confidence', 'random'\].*llada reference"),
    # a reference's own setting named in a call that runs the default sampler (it would be ignored)
    (dict(remasking="random"), "remasking='random'.*reference='llada'"),
    (dict(alg="entropy"), "alg='entropy'.*reference='dream'"),
    (dict(alg="nope"), "alg must be one of"),
    (dict(eps=2.0), r"eps must be a number in \[0, 1\)"),
    (dict(alg_temp=-1.0), "alg_temp must be a number >= 0"),
    # DESIGN section 3's list and the rest of the fields
    (dict(mask_token_id=-1), "mask_token_id must be a token id"),
    (dict(mask_token_id=3.5), "mask_token_id must be a token id"),
    (dict(steps=0), "steps must be an integer >= 1"),
    (dict(steps=2.5), "steps must be an integer >= 1"),
    (dict(steps=True), "steps must be an integer >= 1"),
    (dict(block_length=0), "block_length must be an integer >= 1"),
    (dict(block_length=2.5), "block_length must be an integer >= 1"),
    (dict(max_new_tokens=-1), "max_new_tokens must be an integer >= 0"),
    (dict(max_new_tokens=2.5), "max_new_tokens must be an integer >= 0"),
    (dict(max_new_tokens="4"), "max_new_tokens must be an integer >= 0"),
    (dict(max_new_tokens=200), "exceeds the model's max_position_embeddings=64: shorten"),
    # checked before the canvas is allocated (10**12 positions would not fit in memory)
    (dict(max_new_tokens=10**12), "exceeds the model's max_position_embeddings=64: shorten"),
    (dict(eos_token_id=VOCAB + 3), r"eos_token_id \[20\] is outside the model's vocabulary \(vocab_size=17\)"),
    (dict(eos_token_id=[2, -1]), r"eos_token_id \[-1\] is outside the model's vocabulary"),
    (dict(schedule="nope"), "unknown schedule"),
    (dict(schedule_kwargs={"zzz": 1}), "bad schedule_kwargs"),
    (dict(strategy="nope"), "unknown strategy 'nope': use one of"),
    (dict(strategy=""), "unknown strategy ''"),  # (None is no setting: the next level's value applies)
    (dict(transfer="nope"), "unknown transfer 'nope': use one of"),
    (dict(transfer="threshold"), "transfer='threshold' needs threshold"),
    (dict(transfer="threshold", threshold=1.5), r"threshold must be a number in \(0, 1\]"),
    (dict(threshold=0.0), r"threshold must be a number in \(0, 1\]"),
    (dict(threshold="x"), r"threshold must be a number in \(0, 1\]"),
    (dict(temperature=-0.5), "temperature must be a number >= 0"),
    (dict(temperature="hot"), "temperature must be a number >= 0"),
    (dict(temperature=float("inf")), "temperature must be a number >= 0"),
    (dict(top_k=2.5, temperature=1.0), "top_k must be an integer >= 0"),
    (dict(top_p=0.0, temperature=1.0), r"top_p must be a number in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be a number in \(0, 1\]"),
    (dict(cfg_scale=-1.0), "cfg_scale must be a number >= 0"),
    (dict(cfg_scale=float("nan")), "cfg_scale must be a number >= 0"),
    (dict(cfg_scale="x"), "cfg_scale must be a number >= 0"),
    (dict(logits_shift=2), "logits_shift must be 0, 1 or None"),
    (dict(stop_at_eos="no"), "stop_at_eos must be True or False"),
    (dict(reference="mdlm"), "unknown reference 'mdlm'"),
    (dict(reference="llada", steps=4), "reference='llada' needs block_length"),
    (dict(reference="dream", steps=4, alg="origin", eps=1e-3, strategy="margin"), "strategy='margin' does not apply"),
    # speculative decoding (transfer="speculative", draft_length)
    (dict(transfer="speculative"), "transfer='speculative' needs draft_length >= 1"),
    (dict(transfer="speculative", draft_length=0), "draft_length must be an integer >= 1"),
    (dict(transfer="speculative", draft_length=2.5), "draft_length must be an integer >= 1"),
    (dict(transfer="speculative", draft_length=True), "draft_length must be an integer >= 1"),
    (dict(draft_length=4), "draft_length=4 is read only by transfer='speculative'"),
    # a parameter of one transfer rule under another: it would change nothing
    (
        dict(threshold=0.9),
        "threshold=0.9 is read only by transfer='threshold' / 'llada2' / 'llada21_editing' / 'block_refinement', not by "
        "transfer='deterministic', the transfer in use.*pass transfer='threshold' or drop threshold",
    ),
    (dict(threshold=0.9, transfer="stochastic"), "threshold=0.9 is read only by .*not by transfer='stochastic'"),
    (dict(entropy_bound=0.5), "entropy_bound=0.5 is read only by transfer='entropy_bound'.*pass transfer="),
    (
        dict(transfer="threshold", threshold=0.5, entropy_bound=0.5),
        "entropy_bound=0.5 is read only by transfer='entropy_bound', not by transfer='threshold'",
    ),
    (
        dict(transfer="threshold", threshold=0.5, max_post_steps=4),
        "max_post_steps=4 is read only by transfer='llada21_editing'.*drop max_post_steps",
    ),
    (
        dict(remdm="cap", remdm_eta=0.1, threshold=0.5),
        r"threshold=0.5 is read only by .*not by transfer='stochastic' \(remdm='cap'\)",
    ),
    (
        dict(generation_config=MaskedDiffusionGenerationConfig(threshold=0.9)),
        "threshold=0.9 is read only by transfer='threshold'",
    ),
    (
        dict(transfer="speculative", draft_length=4, kv_cache="dual"),
        "kv_cache='dual' is not supported with transfer='speculative'.*drop kv_cache",
    ),
    (
        dict(transfer="speculative", draft_length=4, cfg_scale=0.5),
        "cfg_scale=0.5 is not supported with transfer='speculative'.*set cfg_scale=0",
    ),
    (
        dict(transfer="speculative", draft_length=4, reference="llada", steps=4, block_length=4),
        "reference='llada' is not supported with transfer='speculative'",
    ),
    (
        dict(transfer="speculative", draft_length=4, strategy="confidence"),
        "strategy='confidence' does not apply to transfer='speculative'.*strategy='left_to_right' or leave strategy unset",
    ),
    # ReMDM remasking (remdm, remdm_eta, remdm_t_on, remdm_t_off)
    (dict(remdm="nope"), r"unknown remdm 'nope': use one of \['cap', 'rescale', 'conf', 'loop'\]"),
    (dict(remdm="cap"), r"remdm='cap' needs remdm_eta in \[0, 1\]"),
    (dict(remdm="cap", remdm_eta=1.5), r"remdm_eta must be a number in \[0, 1\], got 1.5"),
    (dict(remdm="rescale", remdm_eta=-0.1), r"remdm_eta must be a number in \[0, 1\]"),
    (dict(remdm="conf", remdm_eta=2), r"remdm_eta must be a number in \[0, 1\]"),
    (dict(remdm="cap", remdm_eta="x"), r"remdm_eta must be a number in \[0, 1\]"),
    (dict(remdm="loop", remdm_t_on=0.5), "remdm='loop' takes its window as remdm_t_on and remdm_t_off together"),
    (
        dict(remdm="loop", remdm_eta=0.1, remdm_t_on=0.3, remdm_t_off=0.5),
        "the loop window needs 0 < remdm_t_off < remdm_t_on < 1",
    ),
    (dict(remdm="loop", remdm_eta=0.1, remdm_t_on=1.2, remdm_t_off=0.5), "the loop window needs 0 < remdm_t_off"),
    (
        dict(remdm="loop", remdm_eta=0.9, remdm_t_on=0.2, remdm_t_off=0.1),
        r"remdm_eta must be a number in \[0, 0.25\] \(remdm='loop' with alpha_on=0.8.*raise remdm_t_on",
    ),
    (
        dict(remdm="cap", remdm_eta=0.1, remdm_t_on=0.5),
        "remdm_t_on / remdm_t_off / remdm_alpha_on are read only by remdm='loop'",
    ),
    (dict(remdm_eta=0.1), "remdm_eta=0.1: read only by remdm"),
    (
        dict(remdm="cap", remdm_eta=0.1, transfer="deterministic"),
        "transfer='deterministic' does not combine with remdm='cap'.*pass transfer='stochastic' or leave transfer unset",
    ),
    (dict(remdm="conf", transfer="threshold", threshold=0.5), "transfer='threshold' does not combine with remdm"),
    (
        dict(remdm="rescale", remdm_eta=0.1, strategy="confidence"),
        "strategy='confidence' does not combine with remdm='rescale'.*pass strategy='random' or leave strategy unset",
    ),
    (
        dict(remdm="cap", remdm_eta=0.1, reference="llada", steps=4, block_length=4),
        "reference='llada' is not supported with remdm='cap'",
    ),
    (dict(remdm="cap", remdm_eta=0.1, streamer=BaseStreamer()), "streamer is not supported with remdm='cap'"),
    (dict(stepz=3), r"unknown generation argument\(s\) \['stepz'\]"),
    (dict(seed="abc"), "seed must be an integer"),
    (dict(generation_config={"steps": 2}), "generation_config must be a GenerationConfig"),
]


def _case_id(kwargs: dict) -> str:
    """A stable test id: objects are named by their class (their repr holds an address)."""
    return str(
        {
            k: v if isinstance(v, (int, float, str, bool, type(None), list, dict)) else type(v).__name__
            for k, v in kwargs.items()
        }
    )


@pytest.mark.parametrize("kwargs, message", GENERATE_KWARGS, ids=[_case_id(k) for k, _ in GENERATE_KWARGS])
def test_generate_settings(model, forwards, kwargs, message):
    with pytest.raises(ValueError, match=message):
        model.generate(PROMPT, **{"max_new_tokens": 4, **kwargs})
    with pytest.raises(ValueError, match=message):  # the free function: the same checks
        diffusion_generate(model, PROMPT, **{"max_new_tokens": 4, **kwargs})
    assert not forwards, "a forward pass ran before the error"


# -- generate(): inputs ----------------------------------------------------------------------------------------------

GENERATE_INPUTS = [
    (PROMPT.float(), None, "input_ids must hold integer token ids .* got torch.float32"),
    (PROMPT.bool(), None, "input_ids must hold integer token ids"),
    ([[1, 2, 3]], None, "input_ids must be a 2-D LongTensor .* got list"),
    (torch.tensor([1, 2, 3]), None, "input_ids must be a 2-D LongTensor"),
    (torch.tensor([[1, 20, 3]]), None, r"input_ids hold ids outside the model's vocabulary \[0, 17\)"),
    (torch.tensor([[1, -2, 3]]), None, r"input_ids hold ids outside the model's vocabulary \[0, 17\)"),
    (PROMPT, torch.ones(1, 4), "attention_mask must be 2-D"),
    (PROMPT, torch.zeros(1, 3), r"attention_mask is all zeros in row\(s\) \[0\]: every row needs at least one"),
    (PROMPT.repeat(3, 1), torch.tensor([[1, 1, 1], [0, 0, 0], [0, 1, 1]]), r"all zeros in row\(s\) \[1\]"),
]


@pytest.mark.parametrize("input_ids, attention_mask, message", GENERATE_INPUTS, ids=[m for _, _, m in GENERATE_INPUTS])
def test_generate_inputs(model, forwards, input_ids, attention_mask, message):
    with pytest.raises(ValueError, match=message):
        model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=4)
    assert not forwards


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8])
def test_integer_input_ids_of_any_dtype_are_token_ids(model, dtype):
    """Not an error: ids of any integer dtype are the tokens of the same int64 ids."""
    kwargs = dict(max_new_tokens=4, steps=2)
    assert torch.equal(model.generate(PROMPT.to(dtype), **kwargs), model.generate(PROMPT, **kwargs))


# -- generate(): block-causal models ---------------------------------------------------------------------------------


@pytest.mark.parametrize("block_length", [3, 6, 5])
def test_block_length_across_a_block_causal_models_blocks(block_length):
    model = tiny_mdm(block_size=4, vocab_size=VOCAB, mask_token_id=MASK, num_hidden_layers=1, num_attention_heads=2)
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    message = (
        rf"block_length={block_length} cuts across the attention blocks of this block-causal model "
        r"\(model.config.block_size=4\): pass block_length=4 \(the default, leave it unset\), a multiple of 4"
    )
    with pytest.raises(ValueError, match=message):
        model.generate(PROMPT, max_new_tokens=4, block_length=block_length)
    assert not calls


def test_valid_values_of_a_reference_field_in_a_saved_config_stay_accepted(model, forwards):
    """Dream's published generation_config.json holds alg, eps and alg_temp without selecting the reference: the
    default sampler leaves them inert (a call that names one is an error, see the table)."""
    saved = MaskedDiffusionGenerationConfig(alg="origin", eps=1e-3, alg_temp=0.0, steps=4, max_new_tokens=4)
    assert model.generate(PROMPT, generation_config=saved).shape == (1, 7) and forwards
    with pytest.raises(ValueError, match="alg must be one of"):
        MaskedDiffusionGenerationConfig(alg="nope").validate()


# -- the hf_mdm lm-eval model's arguments --------------------------------------------------------------------------

MODEL_ARGS = [
    (dict(steps="abc"), "steps must be an integer >= 1, got 'abc'"),
    (dict(steps=0), "steps must be an integer >= 1"),
    (dict(temperature="hot"), "temperature must be a number >= 0"),
    (dict(top_k=-3), "top_k must be an integer >= 0"),
    (dict(strategy="nope"), "unknown strategy 'nope'"),
    (dict(transfer="threshold", threshold=2), r"threshold must be a number in \(0, 1\]"),
    (dict(cfg_scale=-1), "cfg_scale must be a number >= 0"),
    (dict(transfer="speculative", draft_length=0), "draft_length must be an integer >= 1"),
    (dict(transfer="speculative", draft_length=4, kv_cache="prefix"), "kv_cache='prefix' is not supported"),
    (dict(mask_token_id=10**6), "mask_token_id=1000000 is outside the model's vocabulary"),
    (dict(remdm="rescale"), r"remdm='rescale' needs remdm_eta in \[0, 1\]"),
    (dict(remasking="nope"), "remasking: setting.* of reference=llada.*reference=none"),
    (dict(reference="nope"), "unknown reference 'nope'"),
    (dict(reference="llada", block_length=0), "block_length must be an integer >= 1"),
    (dict(reference="llada", remasking="nope", max_gen_toks=8), "remasking must be one of"),
    (dict(reference="dream", alg="nope"), "alg must be one of"),
    (dict(reference="dream", strategy="margin"), "strategy.*reference=dream.*reference=none"),
    (dict(mc_num=0), "model argument mc_num must be an integer >= 1"),
    (dict(mc_num="abc"), "model argument mc_num must be an integer >= 1"),
    (dict(max_gen_toks=0), "model argument max_gen_toks must be an integer >= 1"),
    (dict(max_gen_toks="x"), "model argument max_gen_toks must be an integer >= 1"),
    (dict(seed="x"), "model argument seed must be an integer"),
    (dict(greedy_check="maybe"), "model argument greedy_check must be True or False"),
    (dict(stepz=3), "unknown model argument 'stepz' for --model hf_mdm \\(did you mean 'steps'"),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from hf_mdm.harness.tiny import build_tiny_models

    return build_tiny_models(tmp_path_factory.mktemp("tiny"))


@pytest.mark.parametrize("args, message", MODEL_ARGS, ids=[str(a) for a, _ in MODEL_ARGS])
def test_lm_eval_model_args(tiny, args, message):
    from hf_mdm.harness.evaluator import create_lm

    with pytest.raises(ValueError, match=message):
        create_lm("hf_mdm", {"pretrained": tiny["mdm"], **args}, batch_size=1, device="cpu")


# -- the command lines -----------------------------------------------------------------------------------------------

HF_MDM_ARGS = [
    (["sample", "--model", "oracle", "--length", "0", "--output", "x.json"], "--length: must be >= 1, got 0"),
    (["sample", "--model", "oracle", "--length", "8", "--num", "-1", "--output", "x.json"], "--num: must be >= 1"),
    (["sample", "--model", "oracle", "--length", "8", "--steps", "0", "--output", "x.json"], "--steps: must be >= 1"),
    (
        ["sample", "--model", "oracle", "--length", "8", "--temperature", "-1", "--output", "x.json"],
        "--temperature: must be >= 0.0",
    ),
    (["sample", "--model", "oracle", "--length", "8", "--output", "x.json"], "--model oracle needs --language"),
    (["sample", "--model", "oracle", "--language", "{tmp}/missing", "--length", "8", "--output", "x.json"], "missing"),
    (["train", "--data", "d", "--kind", "mdm", "--output-dir", "o", "--max-steps", "0"], "--max-steps: must be >= 1"),
    (
        ["train", "--data", "d", "--kind", "mdm", "--output-dir", "o", "--learning-rate", "0"],
        "--learning-rate: must be > 0",
    ),
    (
        ["train", "--data", "d", "--kind", "mdm", "--output-dir", "o", "--batch-size", "abc"],
        "--batch-size: must be an integer, got 'abc'",
    ),
    (["dataset", "build", "ngram2", "--output-dir", "o", "--length", "0"], "--length: must be >= 1"),
    (["score", "--samples", "{tmp}/missing.json", "--language", "l"], "missing.json"),
    (["reproduce", "--jobs", "0"], "--jobs: must be >= 1"),
    (["compare", "--config", "{tmp}/missing.yaml"], "missing.yaml"),
    (["compare", "--config", "c.yaml", "--limit", "0"], "--limit: must be > 0"),
]


@pytest.mark.parametrize("argv, message", HF_MDM_ARGS, ids=[" ".join(a[:1] + [m]) for a, m in HF_MDM_ARGS])
def test_hf_mdm_command_line(tmp_path, capsys, argv, message):
    from hf_mdm.cli import main

    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main(argv))
    assert exit_info.value.code == 2
    assert message.replace("{tmp}", str(tmp_path)) in capsys.readouterr().err


@pytest.fixture(scope="module")
def llama_checkpoint(tmp_path_factory):
    """A tiny autoregressive checkpoint (LlamaForCausalLM) on disk."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=32,
        bos_token_id=1,
        eos_token_id=2,
    )
    path = tmp_path_factory.mktemp("llama")
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--steps", "4"], "--steps applies to diffusion models only: --model .* is an autoregressive checkpoint"),
        (["--transfer", "threshold", "--strategy", "margin"], "--transfer --strategy apply to diffusion models only"),
        (["--temperature", "0.5"], "--temperature applies to diffusion models only"),
        (["--draft-length", "2"], "--draft-length applies to diffusion models only"),
        (["--remdm", "cap", "--remdm-eta", "0.1"], "--remdm --remdm-eta apply to diffusion models only"),
        (["--schedule", "cosine"], "--schedule applies to diffusion models only"),
    ],
)
def test_hf_mdm_sample_refuses_diffusion_flags_for_an_ar_model(llama_checkpoint, tmp_path, capsys, flags, message):
    from hf_mdm.cli import main

    argv = ["sample", "--model", str(llama_checkpoint), "--num", "2", "--length", "4", "--output", str(tmp_path / "s")]
    assert main(argv + flags) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and err.count("\n") == 1, err
    assert not (tmp_path / "s").exists()
    assert main(argv) == 0  # without them it samples the AR model
    assert len(json.loads((tmp_path / "s").read_text())["samples"]) == 2


def test_hf_mdm_eval_command_line(tiny, capsys):
    """Bad model arguments of ``hf-mdm-eval run`` end in one line naming the argument, not a traceback."""
    from hf_mdm.harness.__main__ import main

    argv = [
        "run",
        "--model",
        "hf_mdm",
        "--model_args",
        f"pretrained={tiny['mdm']},steps=0",
        "--tasks",
        "mdm_gsm8k",
        "--device",
        "cpu",
        "--limit",
        "1",
    ]
    assert main(argv) == 2
    assert "hf-mdm-eval: error: steps must be an integer >= 1, got 0" in capsys.readouterr().err
