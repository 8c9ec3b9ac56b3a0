"""hf_mdm and hf_timed as lm-eval models, on tiny local checkpoints: batching, stop strings, ELBO, timing; a
misspelled model argument is one short line, and `python -m hf_mdm.harness.model_args` lists every argument."""

import pytest
import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance

from hf_mdm.generation import diffusion_generate
from hf_mdm.harness import DiffusionGemmaLM, MaskedDiffusionLM, TimedHFLM
from hf_mdm.harness.models import tokens_until_stop
from hf_mdm.harness.tiny import build_tiny_models

PROMPTS = ["Question: what is 2 + 3?\nAnswer:", "Q: 7 * 6?\nA:", "Tell me a story about a cat named"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_models(tmp_path_factory.mktemp("tiny"))


def requests(prompts, gen_kwargs, task="demo"):
    return [Instance("generate_until", {}, (p, dict(gen_kwargs)), i, (task, i, 1)) for i, p in enumerate(prompts)]


def scored(pairs, task="demo"):
    return [Instance("loglikelihood", {}, pair, i, (task, i, 1)) for i, pair in enumerate(pairs)]


def mdm(tiny, **kwargs):
    return MaskedDiffusionLM(pretrained=tiny["mdm"], device="cpu", **kwargs)


def test_batched_generation_equals_one_by_one(tiny):
    """Left-padded batches give each request the text it gets alone (temperature 0, confidence strategy)."""
    kwargs = {"until": ["\n\n"], "max_gen_toks": 24, "do_sample": False}
    alone = mdm(tiny, steps=8, block_length=8, batch_size=1).generate_until(requests(PROMPTS, kwargs))
    model = mdm(tiny, steps=8, block_length=8, batch_size=3)
    batched = model.generate_until(requests(PROMPTS, kwargs))
    assert batched == alone
    records = model.timing.records
    assert [r.batch_size for r in records] == [3, 3, 3]
    assert all(r.nfe == 8 and r.batch_forward_rows == 3 * 8 for r in records)  # each request took part in 8 forwards
    assert all(0 < r.generate_s <= r.time_s for r in records)
    assert all(r.generated_tokens <= 24 and r.output_tokens <= r.generated_tokens for r in records)


def test_each_request_is_cut_at_its_own_stop_strings(tiny):
    model = mdm(tiny, steps=12, block_length=4)
    free = model.generate_until(requests(PROMPTS[:1], {"until": [], "max_gen_toks": 24}))[0]
    stop = free[5:7]
    assert stop and stop in free
    cut, uncut = model.generate_until(
        [
            requests(PROMPTS[:1], {"until": [stop], "max_gen_toks": 24})[0],
            requests(PROMPTS[:1], {"until": ["never appears"], "max_gen_toks": 24})[0],
        ]
    )
    assert cut == free[: free.index(stop)] and uncut == free


def test_sampler_knobs_are_model_args(tiny):
    model = mdm(
        tiny,
        steps=5,
        block_length=8,
        strategy="margin",
        transfer="stochastic",
        schedule="cosine",
        cfg_scale=0.5,
        max_gen_toks=16,
        seed=3,
    )
    config = model.generation_config
    assert (config.steps, config.block_length, config.strategy, config.transfer, config.schedule, config.cfg_scale) == (
        5,
        8,
        "margin",
        "stochastic",
        "cosine",
        0.5,
    )
    model.generate_until(requests(PROMPTS[:1], {"until": []}))
    assert model.timing.records[-1].nfe == 10  # 5 steps, two forwards each with guidance
    with pytest.raises(ValueError, match="strategy"):
        mdm(tiny, strategy="sideways")


def test_elbo_of_one_token_is_its_exact_log_probability(tiny):
    """With a one-token continuation every Monte Carlo sample masks exactly that token: ELBO = log p."""
    model = mdm(tiny, mc_num=4, greedy_check=False)
    context, target = "The cat sat on the m", "a"  # one byte: one token
    ((ll, _),) = model.loglikelihood(scored([(context, target)]))
    ids = model.tok_encode(context + target)
    masked = torch.tensor([ids[:-1] + [model.mask_token_id]])
    with torch.no_grad():
        logits = model.model(masked).logits
    assert ll == pytest.approx(float(F.log_softmax(logits[0, -1].float(), -1)[ids[-1]]), abs=1e-4)


def test_elbo_does_not_depend_on_batching(tiny):
    pairs = [("Question: 2 + 3 =", " 5"), ("The capital of France is", " Paris, of course"), ("a", " b c d e f")]
    one = mdm(tiny, mc_num=8, batch_size=1).loglikelihood(scored(pairs))
    model = mdm(tiny, mc_num=8, batch_size=5)
    many = model.loglikelihood(scored(pairs))
    assert [g for _, g in one] == [g for _, g in many]
    assert [ll for ll, _ in one] == pytest.approx([ll for ll, _ in many], abs=1e-4)
    assert all(ll < 0 for ll, _ in many)
    assert [r.nfe for r in model.timing.records] == [8 + len(c.encode()) for _, c in pairs]  # MC + greedy check
    text = Instance("loglikelihood_rolling", {}, ("some text to score",), 0, ("demo", 0, 1))
    rolling = model.loglikelihood_rolling([text])
    assert len(rolling) == 1 and rolling[0] < 0


def test_greedy_check_is_llada_suffix_greedy_prediction(tiny):
    """is_greedy: the continuation, fully masked and revealed one token per step (most confident first), is
    reproduced exactly."""
    model = mdm(tiny, mc_num=2)
    context = model.tok_encode("Q: 7 * 6?\nA:")
    output = diffusion_generate(
        model.model,
        torch.tensor([context]),
        max_new_tokens=4,
        steps=4,
        strategy="confidence",
        temperature=0.0,
        stop_at_eos=False,
    )
    greedy = output[0, len(context) :].tolist()
    hash_id, dollar_id = model.tok_encode("#")[0], model.tok_encode("$")[0]
    other = greedy[:-1] + [hash_id if greedy[-1] != hash_id else dollar_id]
    assert model._greedy_matches([(context, greedy), (context, other)]) == [True, False]
    text = model.tok_decode(greedy)
    ((_, is_greedy),) = model.loglikelihood(scored([("Q: 7 * 6?\nA:", text)]))
    assert is_greedy == (model.tok_encode(text) == greedy)


def test_timed_hf_counts_tokens_until_the_stop(tiny):
    model = TimedHFLM(pretrained=tiny["llama"], device="cpu", batch_size=2)
    free = model.generate_until(requests(PROMPTS[:1], {"until": [], "max_gen_toks": 20}))[0]
    record = model.timing.records[-1]
    assert record.nfe == record.generated_tokens == 20 and record.output_tokens == 20
    stop = free[8:10]
    texts = model.generate_until(requests(PROMPTS[:1] * 2, {"until": [stop], "max_gen_toks": 20}))
    assert texts == [free[: free.index(stop)]] * 2
    for record in model.timing.records[-2:]:
        assert record.generated_tokens < 20 and record.output_tokens == record.generated_tokens
        assert record.batch_size == 2 and record.generated_tokens <= record.nfe <= 20  # the batch's decoding steps
        assert record.batch_forward_rows == 2 * record.nfe


def test_tokens_until_stop(tiny):
    tokenizer = MaskedDiffusionLM(pretrained=tiny["mdm"], device="cpu").tokenizer
    ids = tokenizer.encode("abc STOP def")
    assert tokens_until_stop(tokenizer, ids, ["STOP"]) == len(tokenizer.encode("abc STOP"))
    assert tokens_until_stop(tokenizer, ids, ["nope"]) == len(ids)


def test_explicit_model_args_win_over_the_task(tiny):
    """lm-eval tasks always send temperature 0 (do_sample: false) and their own max_gen_toks: explicit model
    arguments win; a request's diffusion settings (--gen_kwargs) win over the model's."""
    model = mdm(tiny, steps=4, temperature=0.7, max_gen_toks=12)
    config = model._request_config(model.max_gen_toks, {"temperature": 0.0, "do_sample": False, "steps": 6})
    assert (config.temperature, config.steps) == (0.7, 6)
    model.generate_until(requests(PROMPTS[:1], {"until": [], "max_gen_toks": 40, "do_sample": False}))
    record = model.timing.records[-1]
    assert record.nfe == 4 and record.generated_tokens <= 12


def test_model_argument_mistakes_are_named(tiny, tmp_path):
    with pytest.raises(ValueError, match=r"unknown model argument 'stepz' for --model hf_mdm \(did you mean 'steps'"):
        mdm(tiny, stepz=8)
    with pytest.raises(ValueError, match=r"unknown model argument 'max_gen_tok' .*did you mean 'max_gen_toks'"):
        TimedHFLM(pretrained=tiny["llama"], device="cpu", max_gen_tok=8)
    with pytest.raises(ValueError, match=r"pretrained=.*/mdn: no such file or directory .*has mdm"):
        MaskedDiffusionLM(pretrained=tiny["mdm"][:-1] + "n", device="cpu")
    with pytest.raises(
        ValueError, match=r"pretrained=.*/llama is an autoregressive llama model .*hf-mdm a2d.*hf_timed"
    ):
        MaskedDiffusionLM(pretrained=tiny["llama"], device="cpu")


def test_a_model_built_without_a_device_runs_where_torch_can(tiny, monkeypatch):
    """``create_lm`` (``hf-mdm-eval run`` and ``hf-mdm compare``) on a machine without CUDA and no device named: the
    CPU, as lm-eval's HFLM picks for a device it does not know; a device named in the model arguments is kept."""
    from hf_mdm.harness import evaluator

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert evaluator.create_lm("hf_mdm", {"pretrained": tiny["mdm"], "steps": 2}).device.type == "cpu"
    assert evaluator.create_lm("hf_timed", f"pretrained={tiny['llama']},device=cpu").device.type == "cpu"
    assert evaluator.pick_device(None) == "cpu" and evaluator.pick_device("cuda:1") == "cuda:1"


def test_unknown_gen_kwargs_are_refused_before_any_request(tiny, monkeypatch):
    """A ``--gen_kwargs`` key no sampler takes is a ValueError naming it and the nearest accepted key, raised by
    `simple_evaluate` before lm-eval sees a request; a reference sampler refuses hf_mdm's own settings there too."""
    from lm_eval import evaluator as lm_eval_evaluator

    from hf_mdm.harness.evaluator import simple_evaluate

    runs = []
    monkeypatch.setattr(lm_eval_evaluator, "simple_evaluate", lambda **kwargs: runs.append(kwargs))
    model = mdm(tiny, steps=4)
    with pytest.raises(
        ValueError, match=r"unknown generation kwarg 'stpes' in --gen_kwargs .*did you mean 'steps'\?\)"
    ):
        simple_evaluate(model, tasks=["mdm_gsm8k"], task_manager=object(), gen_kwargs="stpes=4")
    with pytest.raises(ValueError, match=r"'temprature' .*did you mean 'temperature'.*takes .*max_gen_toks.*steps"):
        simple_evaluate(model, tasks=["mdm_gsm8k"], task_manager=object(), gen_kwargs={"temprature": 0.5})
    assert runs == []
    simple_evaluate(
        model, tasks=["mdm_gsm8k"], task_manager=object(), gen_kwargs="steps=4,max_gen_toks=8,do_sample=False"
    )
    assert len(runs) == 1
    with pytest.raises(ValueError, match=r"--gen_kwargs strategy='margin'.*reference=llada runs LLaDA's generate\(\)"):
        mdm(tiny, reference="llada").check_gen_kwargs({"strategy": "margin"})


def test_diffusion_gemma_argument_mistakes_name_it(tiny):
    with pytest.raises(ValueError, match=r"'max_denoising_step' for --model hf_diffusion_gemma \(did you mean") as err:
        DiffusionGemmaLM(pretrained=tiny["diffusion_gemma"], device="cpu", max_denoising_step=8)
    message = str(err.value)
    assert "'max_denoising_steps'" in message and "hf_timed" not in message
    assert message.endswith("every argument it takes: python -m hf_mdm.harness.model_args hf_diffusion_gemma")
    from hf_mdm.harness.model_args import model_arguments

    own = set(model_arguments("hf_diffusion_gemma")["hf_diffusion_gemma's"])
    assert {"batch_invariant", "confidence_threshold", "entropy_bound", "max_denoising_steps", "max_gen_toks"} <= own


def test_a_checkpoint_neither_local_nor_on_the_hub_is_named_at_once(tiny, tmp_path, monkeypatch):
    """A mistyped name without '/' is not left to from_pretrained (half a minute of retries offline, then a Hub
    traceback): offline it fails without a request, online after one request without retries; a legacy Hub id
    without '/' (gpt2) and a model in the Hub cache pass."""
    import types

    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    from hf_mdm.harness.argument_checks import check_pretrained

    monkeypatch.chdir(tmp_path)
    asked = []

    def model_info(self, name, timeout=None, **kwargs):
        asked.append((name, timeout))
        if name == "tiny-mdmm":
            raise RepositoryNotFoundError("404", response=types.SimpleNamespace(headers={}, request=None))
        if name == "org/model":
            raise ConnectionError("[Errno -2] Name or service not known")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda name, filename: None)
    neither = r"pretrained=tiny-mdmm: neither a local folder nor reachable on the Hub \("
    with pytest.raises(ValueError, match=neither + r"the Hub is offline \(HF_HUB_OFFLINE"):
        MaskedDiffusionLM(pretrained="tiny-mdmm", device="cpu")
    with pytest.raises(ValueError, match=neither + "the Hub is offline"):
        TimedHFLM(pretrained="tiny-mdmm", device="cpu")
    with monkeypatch.context() as cached:
        cached.setattr(huggingface_hub, "try_to_load_from_cache", lambda name, filename: f"/cache/{name}/{filename}")
        check_pretrained("gpt2")  # in the Hub cache: loads offline
    assert asked == []
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(ValueError, match=neither + "the Hub has no such model"):
        check_pretrained("tiny-mdmm")
    with pytest.raises(ValueError, match=r"org/model: .* could not be reached: ConnectionError: \[Errno -2\]"):
        check_pretrained("org/model")
    check_pretrained("gpt2")
    with pytest.raises(ValueError, match=r"pretrained=tiny mdm: .*not a valid Hub id"):
        check_pretrained("tiny mdm")
    check_pretrained(tiny["mdm"])
    assert [name for name, _ in asked] == ["tiny-mdmm", "org/model", "gpt2"]
    assert all(0 < timeout <= 10 for _, timeout in asked)  # one request each, never half a minute


def error_line(capsys) -> str:
    """The command's stderr, checked to be one line."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_a_misspelled_model_argument_is_one_short_line(capsys):
    from hf_mdm.harness import model_args
    from hf_mdm.harness.argument_checks import unknown_argument
    from hf_mdm.harness.mdm import MaskedDiffusionLM

    err = unknown_argument("hf_mdm", "stepz", MaskedDiffusionLM.known_arguments())
    message = str(err)
    assert message == (
        "unknown model argument 'stepz' for --model hf_mdm (did you mean 'steps'?); every argument it takes: "
        "python -m hf_mdm.harness.model_args hf_mdm"
    )
    assert model_args.main(["hf_mdm"]) == 0
    listed = capsys.readouterr().out
    assert "the sampler's: " in listed and "lm-eval HFLM's: " in listed and " steps," in listed
    assert model_args.main(["hf"]) == 2
    assert "hf: not one of hf_mdm's lm-eval models (hf_mdm, hf_timed" in error_line(capsys)
