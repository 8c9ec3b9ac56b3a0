"""``hf-mdm serve`` through the official ``openai`` client against 127.0.0.1 on the tiny local models: completions
and chat answer with text, usage and finish reasons; at temperature 0 the served tokens are ``generate``'s; concurrent
requests are batched and each gets what it gets alone; seeds repeat; streaming chunks join to the whole text; limits,
errors and cancellation. Every server here binds a free loopback port and stops when its test ends."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection
from pathlib import Path
from typing import Iterator, Union

import openai
import pytest
import torch

from hf_mdm.harness.tiny import build_tiny_models
from hf_mdm.loading import load_pretrained
from hf_mdm.serve import Engine, ServeSettings, build_app, running
from hf_mdm.serve.runner import free_port

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}  # a server process imports this checkout
PROMPT = "The answer is"
SETTINGS = dict(max_tokens=12, extra_body={"steps": 6, "block_length": 4})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_models(tmp_path_factory.mktemp("serve_models"))


def engine_of(path: str, **settings) -> tuple[Engine, ServeSettings]:
    loaded = load_pretrained(path)
    model, tokenizer = loaded.model, loaded.tokenizer
    serve_settings = ServeSettings(**settings)
    return Engine(model, tokenizer, serve_settings), serve_settings


@pytest.fixture(scope="module")
def mdm_server(tiny):
    engine, settings = engine_of(tiny["mdm"], max_batch=8, max_wait_ms=50.0)
    with running(build_app(engine, settings, "tiny-mdm")) as url:
        yield url, engine


class Reply:
    def __init__(self, status: int, text: str):
        self.status_code, self.text = status, text

    def json(self):
        return json.loads(self.text)


def http(url: str, body: Union[dict, bytes, None] = None, headers: dict = None, timeout: float = 60) -> Reply:
    """A plain HTTP request (POST with a JSON body, or bytes sent as they are; else GET) with the standard library:
    the status and body."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return Reply(answer.status, answer.read().decode())
    except urllib.error.HTTPError as err:
        return Reply(err.code, err.read().decode())


def events(url: str, body: dict, timeout: float = 60) -> Iterator[str]:
    """The ``data:`` payloads of a streamed request (POST ``url`` with ``body`` and ``"stream": true``), as they
    arrive; closing the generator closes the connection (a client that leaves)."""
    parts = urllib.parse.urlsplit(url)
    connection = HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"}
        connection.request("POST", parts.path, json.dumps({**body, "stream": True}), headers)
        answer = connection.getresponse()
        assert answer.status == 200, answer.read()
        for line in answer:
            if line.startswith(b"data:"):
                yield line[5:].strip().decode()
    finally:
        connection.close()


def start_server(arguments: list[str]) -> tuple[subprocess.Popen, str]:
    """``hf-mdm serve`` on a free loopback port, once /health says ok (bounded)."""
    port = free_port()
    command = [sys.executable, "-m", "hf_mdm.cli", "serve", *arguments, "--port", str(port)]
    process = subprocess.Popen(command, env=ENV, stderr=subprocess.PIPE, text=True)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if http(url + "/health", timeout=5).status_code == 200:
                return process, url
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"the server did not become healthy: {process.communicate(timeout=30)[1][-2000:]}")


def client(url: str, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=kw.pop("api_key", "unused"), max_retries=0, timeout=60, **kw)


def direct(engine: Engine, prompt: str, max_tokens: int = 12, **settings) -> str:
    """What ``generate`` gives the prompt alone (the same cuts as the server: first EOS)."""
    ids = engine.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = engine.model.generate(ids, max_new_tokens=max_tokens, **settings)[0, ids.shape[1] :].tolist()
    eos = engine.tokenizer.eos_token_id
    out = out[: out.index(eos)] if eos in out else out
    return engine.tokenizer.decode(out, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def test_completion_and_chat_answer_like_generate(mdm_server):
    url, engine = mdm_server
    c = client(url)
    done = c.completions.create(model="tiny-mdm", prompt=PROMPT, temperature=0, **SETTINGS)
    assert done.choices[0].text == direct(engine, PROMPT, steps=6, block_length=4)
    assert done.choices[0].finish_reason in ("stop", "length")
    assert done.usage.prompt_tokens == len(PROMPT) and done.usage.completion_tokens <= 12
    chat = c.chat.completions.create(model="tiny-mdm", messages=[{"role": "user", "content": "hi"}], **SETTINGS)
    assert isinstance(chat.choices[0].message.content, str) and chat.choices[0].message.role == "assistant"
    assert [m.id for m in c.models.list().data] == ["tiny-mdm"]


def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(mdm_server):
    url, engine = mdm_server
    prompts = [f"Question {i}: what is {i} plus {i}?" for i in range(8)]
    answers: dict[int, str] = {}

    def ask(i: int) -> None:
        answers[i] = (
            client(url)
            .completions.create(model="tiny-mdm", prompt=prompts[i], temperature=0, **SETTINGS)
            .choices[0]
            .text
        )

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [answers[i] for i in range(8)] == [direct(engine, p, steps=6, block_length=4) for p in prompts]
    metrics = http(url + "/metrics").text
    batches = [line for line in metrics.splitlines() if line.startswith("hf_mdm_batch_size_count")]
    sizes = float(next(line for line in metrics.splitlines() if line.startswith("hf_mdm_batch_size_sum")).split()[-1])
    assert float(batches[0].split()[-1]) < sizes  # fewer batches than requests: some ran together


def test_seeds_repeat_and_differ(mdm_server):
    url, _ = mdm_server
    c = client(url)
    kw = dict(model="tiny-mdm", prompt=PROMPT, temperature=1.0, **SETTINGS)
    one, again, other = (c.completions.create(seed=s, **kw).choices[0].text for s in (5, 5, 6))
    assert one == again and one != other


def test_streaming_chunks_join_to_the_whole_text(mdm_server):
    url, _ = mdm_server
    c = client(url)
    for seed in range(3):
        kw = dict(model="tiny-mdm", prompt=PROMPT, temperature=1.0, seed=seed, **SETTINGS)
        whole = c.completions.create(**kw).choices[0]
        chunks = list(c.completions.create(stream=True, **kw))
        assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == whole.text
        assert chunks[-1].choices[0].finish_reason == whole.finish_reason
        chat = list(c.chat.completions.create(model="tiny-mdm", messages=[{"role": "user", "content": "x"}], stream=True,
                                              stream_options={"include_usage": True}, temperature=1.0, seed=seed,
                                              **SETTINGS))  # fmt: skip
        assert chat[-1].usage is not None and chat[-1].usage.completion_tokens >= 0


def test_stop_strings_and_max_tokens(mdm_server):
    url, engine = mdm_server
    c = client(url)
    full = c.completions.create(model="tiny-mdm", prompt=PROMPT, temperature=0, **SETTINGS).choices[0].text
    if len(full) > 2:
        stop = full[1:3]
        cut = c.completions.create(model="tiny-mdm", prompt=PROMPT, temperature=0, stop=stop, **SETTINGS).choices[0]
        assert cut.text == full[: full.index(stop)] and cut.finish_reason == "stop"
    short = c.completions.create(model="tiny-mdm", prompt=PROMPT, temperature=0, max_tokens=2, extra_body={"steps": 2})
    assert short.usage.completion_tokens <= 2


@pytest.mark.parametrize(
    "body, status, says",
    [
        (dict(prompt="x", n=2), 400, "n > 1"),
        (dict(prompt="x", logprobs=2), 400, "logprobs"),
        (dict(prompt="x", tools=[{"type": "function"}]), 400, "tools"),
        (dict(prompt="x", steps=0), 400, "steps"),
        (dict(prompt="x", strategy="nonsense"), 400, "strategy"),
        (dict(prompt="x", colour="red"), 400, "unknown field"),
        (dict(prompt="x", max_tokens=10**6), 400, "max_tokens"),
        (dict(prompt=7), 400, "prompt"),
        (dict(prompt="x", preset="nope"), 400, "preset"),
    ],
)
def test_bad_requests_are_400s_that_say_why(mdm_server, body, status, says):
    url, _ = mdm_server
    answer = http(url + "/v1/completions", {"model": "tiny-mdm", **body}, timeout=30)
    assert answer.status_code == status and says in answer.json()["error"]["message"]


def test_api_key_body_size_queue_and_loading(tiny):
    engine, settings = engine_of(tiny["mdm"], api_key="secret", max_body_bytes=2000, max_queue=1, max_batch=1)
    with running(build_app(engine, settings, "m")) as url:
        assert http(url + "/v1/completions", {"prompt": "x"}).status_code == 401
        with pytest.raises(openai.AuthenticationError):
            client(url, api_key="wrong").completions.create(model="m", prompt="x")
        assert client(url, api_key="secret").completions.create(model="m", prompt="x", **SETTINGS).choices
        big = http(url + "/v1/completions", {"prompt": "x" * 5000}, headers={"Authorization": "Bearer secret"})
        assert big.status_code == 413
        codes = _burst(url, 6, {"prompt": "x", "max_tokens": 12, "steps": 12, "block_length": 12})
        assert 429 in codes and 200 in codes  # one waiting at most: the others are refused
    loading = threading.Event()

    def slow_loader() -> Engine:
        loading.wait(timeout=30)
        return engine

    with running(build_app(None, settings, "m", loader=slow_loader)) as url:
        assert http(url + "/health").status_code == 503
        headers = {"Authorization": "Bearer secret"}
        assert http(url + "/v1/completions", {"prompt": "x"}, headers=headers).status_code == 503
        loading.set()
        deadline = time.monotonic() + 30
        while http(url + "/health").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert http(url + "/health").json() == {"status": "ok"}


def _burst(url: str, count: int, body: dict) -> list[int]:
    headers = {"Authorization": "Bearer secret"}
    with ThreadPoolExecutor(count) as pool:
        answers = list(pool.map(lambda _: http(url + "/v1/completions", body, headers), range(count)))
    return [a.status_code for a in answers]


def test_a_client_that_leaves_stops_its_work(tiny):
    """A long request whose client disconnects: the model's forward count stops rising (its row leaves at the next
    block boundary), far below the request's 512 forwards."""
    engine, settings = engine_of(tiny["mdm"], max_tokens=512)
    with running(build_app(engine, settings, "m")) as url:
        body = {"prompt": "x", "max_tokens": 512, "steps": 512, "block_length": 4}
        with pytest.raises((TimeoutError, socket.timeout, urllib.error.URLError)):
            http(url + "/v1/completions", body, timeout=1.0)
        deadline, last = time.monotonic() + 60, -1
        while engine.forwards != last and time.monotonic() < deadline:
            last = engine.forwards
            time.sleep(1.0)
        assert engine.forwards == last < 256


@pytest.mark.parametrize("name", ["llada2", "diffusion_gemma", "llama"])
def test_other_families_and_an_autoregressive_model(tiny, name):
    engine, settings = engine_of(tiny[name])
    with running(build_app(engine, settings, name)) as url:
        extra = {"block_length": 32} if name == "llada2" else {}
        done = client(url).completions.create(model=name, prompt=PROMPT, temperature=0, max_tokens=8, extra_body=extra)
        assert isinstance(done.choices[0].text, str) and done.usage.prompt_tokens == len(PROMPT)
        if name == "diffusion_gemma":  # its own sampler: a seed repeats, streaming joins to the whole text
            kw = dict(model=name, prompt=PROMPT, max_tokens=8, seed=1)
            whole = client(url).completions.create(**kw).choices[0].text
            chunks = client(url).completions.create(stream=True, **kw)
            assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == whole
            bad = http(url + "/v1/completions", {"prompt": "x", "temperature": 1.0})
            assert bad.status_code == 400 and "uniform-corruption" in bad.json()["error"]["message"]
        if name == "llama":
            bad = http(url + "/v1/completions", {"prompt": "x", "steps": 4})
            assert bad.status_code == 400 and "autoregressive" in bad.json()["error"]["message"]


def test_batch_invariant_in_bfloat16_gives_what_each_gets_alone(tiny):
    loaded = load_pretrained(tiny["mdm"], dtype="bfloat16")
    model, tokenizer = loaded.model, loaded.tokenizer
    settings = ServeSettings(batch_invariant=True, max_batch=8, max_wait_ms=50.0)
    engine = Engine(model, tokenizer, settings)
    prompts = [f"Row {i} says {'x' * i}" for i in range(8)]
    with running(build_app(engine, settings, "m")) as url:
        together = _texts(url, prompts, seed=3)
        alone = [_texts(url, [p], seed=3)[0] for p in prompts]
    assert together == alone


def _texts(url: str, prompts: list[str], seed: int) -> list[str]:
    body = {"max_tokens": 12, "steps": 6, "block_length": 4, "temperature": 1.0, "seed": seed}
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(lambda p: http(url + "/v1/completions", {"prompt": p, **body}, timeout=120), prompts))
    return [a.json()["choices"][0]["text"] for a in answers]


def test_serve_cli_parses_and_refuses_before_loading(tmp_path, capsys):
    from hf_mdm.cli import main

    assert main(["serve", str(tmp_path), "--preset", "llada2", "--generation-config", "x.json"]) == 2
    assert "not both" in capsys.readouterr().err
    assert torch.get_num_threads() >= 1
