"""Continuous batching at block boundaries (`hf_mdm.serve.joining`): on block-causal models a request that arrives
while others run joins them at the next block boundary and a finished one leaves at once; every answer is the text
of one ``generate`` call for that request alone (temperature 0, and with its seed at temperature 1); a short request
does not wait for a long one; `block_plan` against the steps one call gives its blocks."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from test_serve import http

from hf_mdm import MaskedDiffusionGenerationConfig, MDMConfig, MDMForMaskedDiffusion
from hf_mdm.harness.tiny import build_tiny_models, build_tokenizer
from hf_mdm.serve import Engine, ServeSettings, build_app, running
from hf_mdm.serve.joining import block_plan, call_shape, joins_at_blocks
from hf_mdm.serve.loading import load_model


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    paths = build_tiny_models(tmp_path_factory.mktemp("joining_models"))
    llada2, tokenizer = load_model(paths["llada2"])
    tok = build_tokenizer()
    torch.manual_seed(0)
    config = MDMConfig(vocab_size=len(tok), mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                       num_hidden_layers=2, block_size=4)  # fmt: skip
    mdm = MDMForMaskedDiffusion(config).eval()
    with torch.no_grad():  # printable ASCII only: no EOS, so a long request runs its whole length
        printable = [tok.convert_tokens_to_ids(tok.tokenize(chr(byte))[0]) for byte in range(32, 127)]
        keep = torch.zeros(len(tok), dtype=torch.bool)
        keep[printable] = True
        mdm.get_output_embeddings().weight[~keep] = 0.0
    settings = ServeSettings(max_batch=8, max_tokens=512)
    return {"llada2": Engine(llada2, tokenizer, settings), "mdm": Engine(mdm, tok, settings)}


def alone(engine: Engine, prompt: str, body: dict) -> str:
    """One generate call for the request alone, its text cut as the server cuts it (first EOS)."""
    settings = {k: v for k, v in body.items() if k not in ("prompt", "max_tokens", "seed")}
    ids = engine.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    seed = body.get("seed")
    out = engine.model.generate(ids, max_new_tokens=body["max_tokens"], seed=seed, **settings)[0, ids.shape[1] :]
    tokens = out.tolist()
    eos = engine.tokenizer.eos_token_id
    tokens = tokens[: tokens.index(eos)] if eos in tokens else tokens
    return engine.tokenizer.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)


BODIES = {
    "llada2": dict(temperature=0, steps=4, threshold=0.9, transfer="llada2", block_length=32),
    "mdm": dict(temperature=0, steps=12, block_length=4),
}


@pytest.mark.parametrize("name", ["llada2", "mdm"])
def test_staggered_requests_answer_as_one_call_alone(engines, name):
    engine = engines[name]
    prompts = ["a", "hello there", "what is two plus two", "xyz" * 5, "The answer", "ok"]
    lengths = [40, 7, 24, 13, 33, 5]
    bodies = [dict(BODIES[name], prompt=p, max_tokens=n) for p, n in zip(prompts, lengths)]
    with running(build_app(engine, engine.settings, name)) as url:
        assert joins_at_blocks(engine, engine.prepare(_asked(bodies[0])))

        def ask(i: int) -> str:
            time.sleep(0.05 * i)  # arrivals while others run
            return http(url + "/v1/completions", bodies[i], timeout=120).json()["choices"][0]["text"]

        with ThreadPoolExecutor(len(bodies)) as pool:
            served = list(pool.map(ask, range(len(bodies))))
    assert served == [alone(engine, b["prompt"], b) for b in bodies]


def test_a_seeded_row_draws_what_one_call_draws(engines):
    """At temperature 1 a seeded request served block by block draws what one generate call with its seed draws
    (its generator carries over from block to block). Beside rows of other lengths its forwards are a padded
    batch's, whose last bits may move a draw, as in any padded batch; --batch-invariant serves it exactly."""
    engine = engines["mdm"]
    body = dict(BODIES["mdm"], temperature=1.0, seed=11, prompt="seeded", max_tokens=16)
    with running(build_app(engine, engine.settings, "m")) as url:
        mine = http(url + "/v1/completions", body, timeout=120).json()["choices"][0]["text"]
        again = http(url + "/v1/completions", body, timeout=120).json()["choices"][0]["text"]
        other = http(url + "/v1/completions", dict(body, seed=12), timeout=120).json()["choices"][0]["text"]
    assert mine == again == alone(engine, "seeded", body) and other != mine


def test_a_short_request_does_not_wait_for_a_long_one(engines):
    engine = engines["mdm"]
    long = dict(BODIES["mdm"], prompt="long", max_tokens=512, steps=512)
    short = dict(BODIES["mdm"], prompt="short", max_tokens=8, steps=4)
    with running(build_app(engine, engine.settings, "m")) as url:
        with ThreadPoolExecutor(2) as pool:
            started = time.monotonic()
            pending = pool.submit(http, url + "/v1/completions", long, None, 300)
            time.sleep(0.3)  # the long one is running
            assert http(url + "/v1/completions", short, timeout=300).status_code == 200
            short_done = time.monotonic() - started
            assert not pending.done()  # the short one left while the long one still runs
            answer = pending.result()
            assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 512
    assert short_done < time.monotonic() - started


@pytest.mark.parametrize("prompt, new, steps", [(6, 11, 10), (4, 16, 12), (5, 9, 20), (2, 14, 6)])
def test_one_call_per_block_of_the_plan_gives_one_calls_tokens_and_forwards(engines, prompt, new, steps):
    """`block_plan`'s blocks, each generated by a call of its own with the plan's steps, give the tokens and the
    forwards of one call for the whole request (a block-causal model, temperature 0; partial first and last
    blocks, more steps than tokens, several tokens a step). A call of one block attends over a shorter canvas, whose
    sums may round differently in the last bit (6e-8 here), so an exact tie between two confidences may break the
    other way, as in a padded batch; this tiny model's head, cut to printable bytes, has such ties at
    (3, 13, 5)."""
    model = engines["mdm"].model
    config = MaskedDiffusionGenerationConfig(max_new_tokens=new, steps=steps, block_length=4)
    ids = torch.arange(3, 3 + prompt)[None]
    whole = model.generate(ids, generation_config=config, return_dict_in_generate=True)
    prefix, forwards = ids, 0
    for size, block_steps in block_plan(config, prompt, new, 4):
        out = model.generate(prefix, generation_config=config, max_new_tokens=size, steps=block_steps,
                             return_dict_in_generate=True)  # fmt: skip
        prefix, forwards = out.sequences, forwards + out.nfe
    assert prefix.tolist() == whole.sequences.tolist() and forwards == whole.nfe


def test_a_short_request_runs_whole_in_one_call(engines, monkeypatch):
    """A request of a partial block and one whole block is one call with the request's own steps (the call
    generating it alone makes); a longer one is a call per block, each with its plan's steps."""
    config = MaskedDiffusionGenerationConfig(max_new_tokens=7, steps=7, block_length=4)
    assert block_plan(config, 5, 7, 4) == [(3, 3), (4, 4)]
    assert call_shape(block_plan(config, 5, 7, 4), 0, 7) == (7, 7, 2)
    long = block_plan(MaskedDiffusionGenerationConfig(max_new_tokens=11, steps=11, block_length=4), 5, 11, 4)
    assert [call_shape(long, done, 11) for done in range(3)] == [(3, 3, 1), (4, 4, 1), (4, 4, 1)]
    engine, calls = engines["mdm"], []
    run_block = engine.run_block
    monkeypatch.setattr(engine, "run_block", lambda *a: calls.append(a[2:4]) or run_block(*a))
    body = dict(BODIES["mdm"], prompt="short", max_tokens=7, steps=7)
    with running(build_app(engine, engine.settings, "m")) as url:
        text = http(url + "/v1/completions", body, timeout=120).json()["choices"][0]["text"]
    assert calls == [(7, 7)] and text == alone(engine, "short", body)


def _asked(body: dict):
    from hf_mdm.serve.protocol import parse_request

    return parse_request(body, chat=False)
