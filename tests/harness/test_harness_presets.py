"""The lm-eval model ``hf_mdm`` on LLaDA and Dream checkpoints: the reference sampler of the checkpoint
(``preset``), its sampler settings as model arguments, left padding with a pad token other than [MASK], and
lm-eval's ``--apply_chat_template`` through the tokenizer's chat template.

The checkpoints (written by the helper `tokenized_checkpoints`) are in the published formats (``config.json`` with
every published key, tiny sizes; safetensors with the published parameter names, random weights), each with hf_mdm's
tiny byte-level tokenizer (which has a chat template) saved beside it. Greedy generation through the lm-eval model
must give, token for token, what
``model.generate(..., generation_config=MaskedDiffusionGenerationConfig.llada(...) / .dream(...))`` gives on the same
left-padded prompts.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import datasets
import pytest
import torch
from lm_eval.api.instance import Instance
from tokenized_checkpoints import write_checkpoint
from transformers import AutoModelForMaskedLM, AutoTokenizer

from hf_mdm.generation import MaskedDiffusionGenerationConfig
from hf_mdm.harness import MaskedDiffusionLM, simple_evaluate
from hf_mdm.harness.evaluator import build_task_manager, create_lm
from hf_mdm.harness.reproducible import request_seed
from hf_mdm.harness.timing import tag_requests
from hf_mdm.harness.tiny import CHAT_TEMPLATE, EOS, MASK, build_tiny_models, build_tokenizer

PROMPTS = ["Question: what is 2 + 3?\nAnswer:", "Q: 7 * 6?\nA:", "Tell me a story about a cat named"]
SEED = 1234  # lm-eval's default torch seed, which the lm-eval model takes as its seed


# ----------------------------------------------------------------------------------------------------------------
# Tiny published-format checkpoints with a tokenizer (written by `tokenized_checkpoints`)
# ----------------------------------------------------------------------------------------------------------------


def tokenizer_without_pad():
    tokenizer = build_tokenizer()
    tokenizer.pad_token = None
    return tokenizer


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """LLaDA with a tokenizer that has no pad token (pads with EOS, as LLaDA's config says); Dream with one."""
    root = tmp_path_factory.mktemp("presets")
    return {
        "llada": write_checkpoint(root / "llada", "llada", tokenizer_without_pad()),
        "dream": write_checkpoint(root / "dream", "dream", build_tokenizer(), seed=1),
    }


def lm(path, **kwargs) -> MaskedDiffusionLM:
    """The lm-eval model with one random stream for the run (seeded with SEED), as `reference_generation` draws."""
    kwargs = {"seed": SEED, "per_request_seeds": False, **kwargs}
    return MaskedDiffusionLM(pretrained=str(path), device="cpu", dtype="float32", **kwargs)


def requests(prompts, gen_kwargs, task="demo"):
    return [Instance("generate_until", {}, (p, dict(gen_kwargs)), i, (task, i, 1)) for i, p in enumerate(prompts)]


def spy_batches(model: MaskedDiffusionLM) -> list[dict]:
    """Record every batch the lm-eval model generates: its padded input, its config and its generated tokens."""
    seen, generate_batch, request_config = [], model._generate_batch, model._request_config

    def record_config(*args):
        config = request_config(*args)
        seen.append({"config": config})
        return config

    def record_batch(input_ids, attention_mask, until, max_gen_toks, kwargs, seeds):
        out = generate_batch(input_ids, attention_mask, until, max_gen_toks, kwargs, seeds)
        seen[-1].update(input_ids=input_ids.clone(), attention_mask=attention_mask.clone(), tokens=out["tokens"])
        return out

    model._request_config, model._generate_batch = record_config, record_batch
    return seen


def reference_generation(path, prompts, config, batch_size):
    """``model.generate`` with the preset on an independently loaded model, batched as the lm-eval model batches
    (longest prompt first, left padding); a row is cut at its first EOS as lm-eval cuts (``until`` holds the EOS
    string). Returns ({prompt: text}, [(input_ids, attention_mask, new tokens, nfe) per batch])."""
    model = AutoModelForMaskedLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    assert tokenizer.pad_token_id != model.config.mask_token_id
    ordered = sorted(prompts, key=lambda p: (-len(tokenizer.encode(p)), p))
    generator = torch.Generator().manual_seed(SEED)
    texts, batches = {}, []
    for start in range(0, len(ordered), batch_size):
        chunk = ordered[start : start + batch_size]
        enc = tokenizer(chunk, padding=True, padding_side="left", return_tensors="pt")
        out = model.generate(
            enc.input_ids,
            attention_mask=enc.attention_mask,
            generation_config=config,
            generator=generator,
            return_dict_in_generate=True,
        )
        new = out.sequences[:, enc.input_ids.shape[1] :]
        batches.append((enc.input_ids, enc.attention_mask, new, out.nfe))
        for prompt, row in zip(chunk, new.tolist()):
            row = row[: row.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in row else row
            texts[prompt] = tokenizer.decode(row, skip_special_tokens=True)
    return texts, batches


# ----------------------------------------------------------------------------------------------------------------
# Generation through the lm-eval model = model.generate with the preset
# ----------------------------------------------------------------------------------------------------------------

CASES = {
    # one of these cases writes EOS mid-generation (checked below): the cut at EOS is exercised
    "llada-greedy-2-blocks": ("llada", dict(steps=8, block_length=8), dict(gen_length=16, steps=8, block_length=8)),
    "llada-greedy-1-block": ("llada", dict(), dict(gen_length=16, steps=16, block_length=16)),
    "llada-random-remasking-cfg": (
        "llada",
        dict(steps=8, remasking="random", cfg_scale=1.0),
        dict(gen_length=16, steps=8, block_length=16, remasking="random", cfg_scale=1.0),
    ),
    "dream-greedy-origin": ("dream", dict(steps=8), dict(max_new_tokens=16, steps=8)),
    "dream-greedy-entropy": ("dream", dict(steps=16, alg="entropy"), dict(max_new_tokens=16, steps=16, alg="entropy")),
    "dream-greedy-topk-margin-eps": (
        "dream",
        dict(steps=5, alg="topk_margin", eps=0.0),
        dict(max_new_tokens=16, steps=5, alg="topk_margin", eps=0.0),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_generation_through_lm_eval_is_the_presets_token_for_token(checkpoints, case):
    arch, model_args, preset_args = CASES[case]
    model = lm(checkpoints[arch], batch_size=2, **model_args)
    assert model.reference == arch  # reference=auto, from config.json's model_type
    seen = spy_batches(model)
    texts = model.generate_until(requests(PROMPTS, {"until": [], "max_gen_toks": 16, "do_sample": False}))

    preset = getattr(MaskedDiffusionGenerationConfig, arch)(**preset_args)
    expected, batches = reference_generation(checkpoints[arch], PROMPTS, preset, batch_size=2)
    assert texts == [expected[p] for p in PROMPTS]
    eos, pad = model.tokenizer.eos_token_id, model.tokenizer.pad_token_id
    assert len(seen) == len(batches) == 2
    for record, (input_ids, attention_mask, new, _) in zip(seen, batches):
        assert record["config"].reference == arch
        assert torch.equal(record["input_ids"], input_ids) and torch.equal(record["attention_mask"], attention_mask)
        for got, want in zip(record["tokens"].tolist(), new.tolist()):
            cut = want.index(eos) + 1 if eos in want else len(want)
            assert got[:cut] == want[:cut]  # token for token through the first EOS ...
            assert all(token == pad for token in got[cut:])  # ... then padding
    if case == "llada-greedy-2-blocks":
        assert any(eos in row[1:] and row[0] != eos for *_, new, _ in batches for row in new.tolist())
    records = model.timing.records  # one per request, each with its batch's forward passes
    assert len(records) == 3 and all(r.generate_s > 0 and r.nfe > 0 for r in records)
    assert sorted(r.nfe for r in records) == sorted(nfe for ids, *_, nfe in batches for _ in range(ids.shape[0]))
    assert all(r.batch_forward_rows == r.nfe * r.batch_size for r in records)


def test_per_request_seeds_give_each_request_its_answer_at_any_batch_size(checkpoints):
    """A preset that draws (LLaDA's random remasking): with per-request seeds (the default) a request's answer is
    the preset's generate on its prompt alone with the request's seed, at batch size 1 and 3 alike."""
    settings = dict(steps=8, remasking="random")
    answers = []
    for batch_size in (1, 3):
        model = MaskedDiffusionLM(pretrained=str(checkpoints["llada"]), device="cpu", batch_size=batch_size, **settings)
        answers.append(model.generate_until(requests(PROMPTS, {"until": [], "max_gen_toks": 16})))
    assert answers[0] == answers[1]
    tags = tag_requests(requests(PROMPTS, {}))
    preset = MaskedDiffusionGenerationConfig.llada(gen_length=16, steps=8, block_length=16, remasking="random")
    network = AutoModelForMaskedLM.from_pretrained(checkpoints["llada"], dtype=torch.float32).eval()
    for prompt, tag, answer in zip(PROMPTS, tags, answers[0]):
        seed = request_seed(model.seed, tag, prompt, {"until": [], "max_gen_toks": 16})
        ids = model.tokenizer(prompt, return_tensors="pt").input_ids
        row = network.generate(ids, generation_config=preset, seed=seed)[0, ids.shape[1] :].tolist()
        eos = model.tokenizer.eos_token_id
        row = row[: row.index(eos)] if eos in row else row
        assert answer == model.tokenizer.decode(row, skip_special_tokens=True)


def test_stop_strings_cut_the_preset_generation(checkpoints):
    model = lm(checkpoints["llada"], steps=8, block_length=8)
    free = model.generate_until(requests(PROMPTS[2:], {"until": [], "max_gen_toks": 16}))[0]
    stop = free[5:7]
    assert len(stop) == 2
    cut = model.generate_until(requests(PROMPTS[2:], {"until": [stop], "max_gen_toks": 16}))[0]
    assert cut == free[: free.index(stop)]
    record = model.timing.records[-1]
    assert record.nfe == 8 and record.output_tokens < record.generated_tokens


def test_request_gen_kwargs_of_the_preset_apply(checkpoints):
    """--gen_kwargs of the preset's settings override the model arguments (temperature given as a model
    argument wins over the task's temperature 0)."""
    model = lm(checkpoints["dream"], steps=8, temperature=0.5)
    config = model._request_config(16, {"steps": 4, "alg": "entropy", "temperature": 0.0, "do_sample": False})
    assert (config.reference, config.steps, config.alg, config.temperature, config.eps) == (
        "dream",
        4,
        "entropy",
        0.5,
        1e-3,
    )
    llada = lm(checkpoints["llada"], block_length=4)
    config = llada._request_config(16, {"temperature": 0.0, "top_p": 1.0, "remasking": "random"})
    assert (config.max_new_tokens, config.block_length, config.steps, config.remasking) == (16, 4, 16, "random")
    assert (config.logits_eos_inf, config.confidence_eos_eot_inf, config.cfg_scale) == (False, False, 0.0)


# ----------------------------------------------------------------------------------------------------------------
# Choosing the preset, and the errors
# ----------------------------------------------------------------------------------------------------------------


def test_preset_auto_follows_the_model_type(checkpoints, tmp_path):
    assert lm(checkpoints["llada"]).reference == "llada"
    assert lm(checkpoints["dream"]).reference == "dream"
    mdm = build_tiny_models(tmp_path)["mdm"]
    assert lm(mdm).reference == "none"
    assert lm(mdm, steps=4)._request_config(8, {}).reference is None
    # reference=none on a LLaDA checkpoint: hf_mdm's sampler and its settings; "none" in --model_args parses to None
    none = create_lm(
        "hf_mdm",
        f"pretrained={checkpoints['llada']},reference=none,dtype=float32,strategy=margin,steps=4",
        device="cpu",
    )
    assert none.reference == "none"
    config = none._request_config(8, {})
    assert config.reference is None and config.strategy == "margin"
    assert lm(checkpoints["dream"], reference="llada", steps=4).reference == "llada"
    with pytest.raises(ValueError, match="unknown reference"):
        lm(checkpoints["dream"], reference="maskgit")


def test_former_argument_name_preset_still_chooses_the_reference(checkpoints):
    with pytest.warns(FutureWarning, match="`preset` is now `reference`"):
        model = lm(checkpoints["dream"], preset="llada", steps=4)
    assert model.reference == "llada" and model._request_config(8, {}).reference == "llada"
    with pytest.raises(ValueError, match="disagree"), pytest.warns(FutureWarning):
        lm(checkpoints["dream"], preset="llada", reference="dream")


@pytest.mark.parametrize(
    "arch, knob",
    [
        ("llada", {"transfer": "stochastic"}),
        ("llada", {"strategy": "margin"}),
        ("llada", {"top_k": 5}),
        ("llada", {"alg": "entropy"}),
        ("dream", {"schedule": "cosine"}),
        ("dream", {"block_length": 8}),
        ("dream", {"remasking": "random"}),
    ],
)
def test_a_setting_the_preset_lacks_is_an_error(checkpoints, arch, knob):
    ((name, value),) = knob.items()
    with pytest.raises(ValueError, match=f"{name}=.*reference={arch}.*reference=none"):
        lm(checkpoints[arch], **knob)


def test_foreign_settings_fail_before_loading_and_in_requests(checkpoints, tmp_path):
    with pytest.raises(ValueError, match="reference=none"):  # not an OSError: checked before anything is loaded
        lm(tmp_path / "does-not-exist", reference="llada", transfer="threshold")
    model = lm(checkpoints["llada"], steps=8)
    with pytest.raises(ValueError, match="generation kwarg strategy='margin'.*reference=none"):
        model.generate_until(requests(PROMPTS[:1], {"until": [], "max_gen_toks": 16, "strategy": "margin"}))
    with pytest.raises(ValueError, match="top_p.*reference=none"):
        model.generate_until(requests(PROMPTS[:1], {"until": [], "max_gen_toks": 16, "top_p": 0.9}))
    # reference settings with hf_mdm's own sampler would be ignored: refused instead
    with pytest.raises(ValueError, match="alg: setting.*reference=dream.*reference=none"):
        lm(build_tiny_models(tmp_path / "tiny")["mdm"], alg="entropy")


def test_llada_length_rules_name_the_model_arguments(checkpoints):
    with pytest.raises(ValueError, match=r"max_gen_toks=16.*block_length=6.*divisor of 16, e.g. 4 or 16"):
        lm(checkpoints["llada"], max_gen_toks=16, block_length=6)
    with pytest.raises(ValueError, match=r"steps=6, max_gen_toks // block_length = 16 // 4 = 4 blocks.*steps.* 4 or 8"):
        lm(checkpoints["llada"], max_gen_toks=16, block_length=4, steps=6)
    model = lm(checkpoints["llada"], block_length=5)  # the task's max_gen_toks is only known with the request
    with pytest.raises(ValueError, match="max_gen_toks=16 .*block_length=5"):
        model.generate_until(requests(PROMPTS[:1], {"until": [], "max_gen_toks": 16}))


# ----------------------------------------------------------------------------------------------------------------
# Tokenizer: pad token, chat template
# ----------------------------------------------------------------------------------------------------------------


def test_pad_token_is_never_the_mask(checkpoints, tmp_path):
    model = lm(checkpoints["llada"])  # the tokenizer has no pad token: EOS
    assert model.tokenizer.pad_token_id == model.tokenizer.eos_token_id != model.mask_token_id
    assert lm(checkpoints["dream"]).tokenizer.pad_token == "<|pad|>"  # the tokenizer's own
    path = tmp_path / "llada-pad-is-mask"
    shutil.copytree(checkpoints["llada"], path)
    tokenizer = build_tokenizer()
    tokenizer.pad_token = MASK
    tokenizer.save_pretrained(path)
    model = lm(path, steps=4)
    assert model.tokenizer.pad_token == EOS and model.tokenizer.pad_token_id != model.mask_token_id
    input_ids, attention_mask = model.tok_batch_encode(PROMPTS[:2])  # the second prompt is shorter: left-padded
    assert attention_mask[1, 0] == 0 and input_ids[1, 0] == model.tokenizer.eos_token_id
    assert model.mask_token_id not in input_ids.tolist()[1]


def gsm_like(**kwargs) -> datasets.DatasetDict:
    rows = [{"question": "Tom has 3 apples and buys 4 more. How many apples does he have?", "answer": "#### 7"}]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


TASK = {
    "task": "tiny_chat_qa",
    "custom_dataset": gsm_like,
    "output_type": "generate_until",
    "test_split": "test",
    "doc_to_text": "Question: {{question}}\nAnswer:",
    "doc_to_target": "{{answer}}",
    "generation_kwargs": {"until": ["Question:"], "do_sample": False, "temperature": 0.0, "max_gen_toks": 16},
    "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
}


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_apply_chat_template_reaches_the_model(checkpoints, arch):
    """lm-eval's --apply_chat_template: the request context is the tokenizer's chat template applied to the
    question, and the answer is the preset's generation from exactly that context."""
    model = lm(checkpoints[arch], steps=8)
    assert model.chat_template(True) == CHAT_TEMPLATE
    seen = spy_batches(model)
    tasks = build_task_manager(["mdm_gsm8k"])  # hf_mdm's task folder only, not lm-eval's ~15k configs (slow)
    results = simple_evaluate(model, tasks=[TASK], apply_chat_template=True, log_samples=True, task_manager=tasks)
    (sample,) = results["samples"]["tiny_chat_qa"]
    ((context, gen_kwargs),) = sample["arguments"]  # the request the model received
    assert gen_kwargs["max_gen_toks"] == 16
    question = "Question: " + gsm_like()["test"][0]["question"] + "\nAnswer:"
    assert context == f"<|user|>\n{question}\n<|assistant|>\n"
    assert context == model.apply_chat_template([{"role": "user", "content": question}])
    (record,) = seen
    assert torch.equal(record["input_ids"][0], torch.tensor(model.tokenizer.encode(context)))
    preset_args = dict(gen_length=16, steps=8, block_length=16) if arch == "llada" else dict(max_new_tokens=16, steps=8)
    preset = getattr(MaskedDiffusionGenerationConfig, arch)(**preset_args)
    expected, _ = reference_generation(checkpoints[arch], [context], preset, batch_size=1)
    answer = expected[context]
    answer = answer[: answer.index("Question:")] if "Question:" in answer else answer
    assert sample["resps"] == [[answer]]
