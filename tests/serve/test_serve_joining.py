"""Continuous batching at the model call (`hf_mdm.serve.joining`, `hf_mdm.serve.forwards`): cohorts of requests run
as their own ``generate`` calls and the forwards asked at the same time run batched, so a request joins at the next
forward and leaves after its last. Every answer is its ``generate`` call alone, bit for bit, whatever else runs and
whenever it arrives (the CPU in float32 batches rows of one shape invariantly): requests of one prompt length by
default, any lengths with ``--batch-invariant``; a bidirectional MDM and a block-causal LLaDA2, without a cache and
with each request's own prefix / dual / exact block cache, greedy and seeded. None of these tests depends on arrival
timing: what they compare holds under any interleaving."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from test_serve import http

from hf_mdm import MDMConfig, MDMForMaskedDiffusion
from hf_mdm.harness.tiny import build_tiny_models, build_tokenizer
from hf_mdm.loading import load_pretrained
from hf_mdm.serve import Engine, ServeSettings, build_app, running
from hf_mdm.serve.forwards import RowLeft, SharedForwards
from hf_mdm.serve.protocol import parse_request

PROMPTS = ["a", "hello there", "what is two plus two", "xyz" * 5, "The answer", "ok", "hello there", "ab"]
LENGTHS = [13, 7, 24, 13, 9, 5, 16, 8]
BODIES = {
    "llada2": dict(temperature=0, steps=4, threshold=0.9, transfer="llada2", block_length=32),
    "mdm": dict(temperature=0, steps=12, block_length=4),
}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    paths = build_tiny_models(tmp_path_factory.mktemp("joining_models"))
    loaded = load_pretrained(paths["llada2"])
    llada2, tokenizer = loaded.model, loaded.tokenizer
    tok = build_tokenizer()
    torch.manual_seed(0)
    config = MDMConfig(vocab_size=len(tok), mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                       num_hidden_layers=2)  # fmt: skip
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


def invariant(engine: Engine) -> Engine:
    """The engine's model and tokenizer served with ``--batch-invariant``."""
    return Engine(engine.model, engine.tokenizer, ServeSettings(max_batch=8, max_tokens=512, batch_invariant=True))


def served(url: str, bodies: list[dict]) -> list[str]:
    """The texts of ``bodies``, sent all at once (each in its own client thread)."""
    with ThreadPoolExecutor(len(bodies)) as pool:
        replies = list(pool.map(lambda b: http(url + "/v1/completions", b, timeout=300), bodies))
    assert [r.status_code for r in replies] == [200] * len(bodies), [r.text for r in replies]
    return [r.json()["choices"][0]["text"] for r in replies]


@pytest.mark.parametrize("name, cache", [("mdm", None), ("mdm", "prefix"), ("mdm", "dual"), ("llada2", "prefix")])
def test_concurrent_requests_answer_as_their_call_alone(engines, name, cache):
    """Eight requests of six prompt lengths and six output lengths at once, with --batch-invariant: each answer is its
    call alone (with a cache, the request's own keys/values, kept from its first forward to its last)."""
    engine = invariant(engines[name])
    extra = {} if cache is None else {"kv_cache": cache}
    bodies = [dict(BODIES[name], prompt=p, max_tokens=n, **extra) for p, n in zip(PROMPTS, LENGTHS)]
    before = engine.forwards
    with running(build_app(engine, engine.settings, name)) as url:
        assert served(url, bodies) == [alone(engine, b["prompt"], b) for b in bodies]
    assert engine.forwards > before


@pytest.mark.parametrize("name", ["mdm", "llada2"])
def test_requests_of_one_prompt_length_answer_as_alone_by_default(engines, name):
    """Without --batch-invariant: eight requests of one prompt length (three output lengths, with and without the
    cache) in whatever cohorts their arrival makes: no row is padded, so each answer is its call alone."""
    engine = engines[name]
    prompts = ["alpha", "bravo", "delta", "gamma", "omega", "sigma", "kappa", "theta"]
    bodies = [dict(BODIES[name], prompt=p, max_tokens=(6, 9, 12)[i % 3]) for i, p in enumerate(prompts)]
    bodies = [dict(b, kv_cache="prefix") if i % 2 else b for i, b in enumerate(bodies)]
    with running(build_app(engine, engine.settings, name)) as url:
        assert served(url, bodies) == [alone(engine, b["prompt"], b) for b in bodies]


def test_a_seeded_request_draws_what_its_call_draws_beside_others(engines):
    engine = invariant(engines["mdm"])
    body = dict(BODIES["mdm"], temperature=1.0, seed=11, prompt="seeded", max_tokens=16)
    others = [dict(BODIES["mdm"], prompt=p, max_tokens=n) for p, n in zip(PROMPTS[:5], LENGTHS[:5])]
    with running(build_app(engine, engine.settings, "m")) as url:
        texts = served(url, [body, *others, dict(body, seed=12)])
    assert texts[0] == alone(engine, "seeded", body) and texts[-1] == alone(engine, "seeded", dict(body, seed=12))
    assert texts[0] != texts[-1]


def _members(shared: SharedForwards, jobs: list, work) -> list:
    """``work(job)`` for every job in a thread of its own, each registered as a member before any starts: the
    first round of forwards then holds every job's first forward (no timing involved)."""
    gate = threading.Barrier(len(jobs))

    def one(job):
        with shared.member():
            gate.wait(timeout=60)
            return work(job)

    with ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(one, jobs))


def test_forwards_of_one_shape_run_as_one_batch(engines):
    """Four calls of one prompt length, registered before any forward: every round is one batched forward of the
    four rows (their LM-head columns differ: the union is asked), so the four calls cost the forwards of one, and
    each gets its tokens alone."""
    tok = build_tokenizer()
    torch.manual_seed(1)
    model = MDMForMaskedDiffusion(MDMConfig(vocab_size=len(tok), mask_token_id=tok.mask_token_id, hidden_size=32,
                                            num_attention_heads=2, intermediate_size=64, num_hidden_layers=2)).eval()  # fmt: skip
    seen: list[int] = []
    shared = SharedForwards(model, on_forward=lambda rows, calls: seen.append(calls))
    ids = [torch.tensor([[5 + k, 6, 7]]) for k in range(4)]
    kwargs = dict(max_new_tokens=8, steps=8, block_length=4, temperature=0)
    outs = _members(shared, ids, lambda row: model.generate(row, **kwargs))
    assert seen == [4] * 8
    assert all(torch.equal(out, model.generate(row, **kwargs)) for row, out in zip(ids, outs))
    assert len({tuple(out[0, 3:].tolist()) for out in outs}) > 1  # the rows differ: their columns did too


class _Out(dict):
    def __getattr__(self, name):
        return self[name]


def test_a_faulty_forward_fails_its_call_alone():
    """A batched forward that raises is retried a call at a time: only the call whose rows fail gets the error."""
    layer = torch.nn.Linear(4, 4)

    class Model(torch.nn.Module):
        def forward(self, x):
            if (x == 13).any():
                raise RuntimeError("bad row")
            return _Out(logits=layer(x))

    model, calls = Model(), []
    shared = SharedForwards(model, on_forward=lambda rows, n: calls.append(n))
    rows = [torch.full((1, 4), float(v)) for v in (1, 13, 2)]

    def work(row):
        try:
            return model(row)["logits"]
        except RuntimeError as err:
            return str(err)

    with torch.no_grad():
        results = _members(shared, rows, work)
    assert results[1] == "bad row" and calls == [1, 1]  # the batch of 3 failed; the good rows ran alone
    with torch.no_grad():
        assert torch.equal(results[0], layer(rows[0])) and torch.equal(results[2], layer(rows[2]))


def test_a_member_that_left_stops_at_its_next_forward():
    model = torch.nn.Linear(2, 2)
    shared, left = SharedForwards(model), threading.Event()
    with shared.member(left.is_set):
        model(torch.ones(1, 2))
        left.set()
        with pytest.raises(RowLeft):
            model(torch.ones(1, 2))


def test_a_short_request_does_not_wait_for_a_long_one(engines):
    engine = engines["mdm"]
    long = dict(BODIES["mdm"], prompt="long", max_tokens=512, steps=512)
    short = dict(BODIES["mdm"], prompt="short", max_tokens=8, steps=4)
    with running(build_app(engine, engine.settings, "m")) as url:
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(http, url + "/v1/completions", long, None, 300)
            _until(lambda: engine.shared is not None and engine.shared._members == 1)  # the long one runs
            assert http(url + "/v1/completions", short, timeout=300).status_code == 200
            assert not pending.done()  # the short one left while the long one still runs (512 steps)
            answer = pending.result()
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 512


def test_a_dropped_request_leaves_at_its_next_forward(engines):
    """A long streamed request whose client disconnects after its first chunk: its call ends at its next forward
    (far below its 512), and the server runs nothing more."""
    engine = engines["mdm"]
    body = dict(BODIES["mdm"], prompt="x", max_tokens=512, steps=512, stream=True)
    with running(build_app(engine, engine.settings, "m")) as url:
        before = engine.forwards
        request = urllib.request.Request(
            url + "/v1/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=60) as reply:
            reply.readline()  # the first event: the request is running
        _until(lambda: engine.shared._members == 0)
        ran = engine.forwards - before
        time.sleep(0.2)
        assert engine.forwards - before == ran < 256


def test_the_cache_budget_queues_and_refuses(engines):
    """With --max-cache-tokens: a request whose cache can never fit is a 400 saying so; two that fit only one at
    a time are both answered, each as its call alone."""
    model, tok = engines["mdm"].model, engines["mdm"].tokenizer
    settings = ServeSettings(max_batch=8, max_tokens=512, max_cache_tokens=40)
    engine = Engine(model, tok, settings)
    bodies = [dict(BODIES["mdm"], prompt=p, max_tokens=24, kv_cache="dual") for p in ("hello", "there")]
    with running(build_app(engine, settings, "m")) as url:
        refused = http(url + "/v1/completions", dict(bodies[0], max_tokens=64))
        texts = served(url, bodies)
    assert refused.status_code == 400 and "max-cache-tokens 40" in refused.json()["error"]["message"]
    assert texts == [alone(engine, b["prompt"], b) for b in bodies]
    job = engine.prepare(parse_request(bodies[0], chat=False))
    assert engine.cache_tokens(job) == len(job.ids) + 24


@pytest.mark.parametrize("scheduler", ["micro-batch", "one"])
def test_the_other_schedulers_answer_as_generate(engines, scheduler):
    model, tok = engines["mdm"].model, engines["mdm"].tokenizer
    settings = ServeSettings(max_batch=8, max_tokens=512, scheduler=scheduler)
    engine = Engine(model, tok, settings)
    bodies = [dict(BODIES["mdm"], prompt=p, max_tokens=12) for p in PROMPTS[:4]]
    with running(build_app(engine, settings, "m")) as url:
        assert served(url, bodies) == [alone(engine, b["prompt"], b) for b in bodies]
    assert engine.shared is None  # no call joined


def _until(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        time.sleep(0.01)
