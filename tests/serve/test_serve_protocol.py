"""The server's protocol rules on a tiny MDM at 127.0.0.1: bodies it cannot honour are 4xx with OpenAI's error
object naming the field (a lone surrogate, a body nested 100,000 levels deep, a step count above the cap, unknown
fields, roles, response formats and content types), another model is a 404, 429 and 503 carry ``Retry-After``,
/health and /metrics are open without the API key, and presets: a request's ``preset`` and the server's
``--preset`` build the same config from the request's length, and a preset missing settings says which to send."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_serve import engine_of, http

from hf_mdm import MaskedDiffusionGenerationConfig
from hf_mdm.generation_presets import PRESET_NAMES
from hf_mdm.harness.tiny import build_tiny_models
from hf_mdm.serve import build_app, running

BODY = {"model": "m", "prompt": "x", "max_tokens": 8, "steps": 8, "block_length": 4}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_models(tmp_path_factory.mktemp("protocol_models"))


@pytest.fixture(scope="module")
def server(tiny):
    engine, settings = engine_of(tiny["mdm"], api_key="secret", max_tokens=64, default_max_tokens=8)
    with running(build_app(engine, settings, "m")) as url:
        yield url, engine


AUTH = {"Authorization": "Bearer secret"}


@pytest.mark.parametrize(
    "data, says",
    [
        (b'{"model": "m", "prompt": "\\ud800"}', "not valid JSON"),  # a lone surrogate, as a raw JSON escape
        (b'{"model": "m", "prompt": "x", "steps": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "recursion limit"),
        (b'{"model": "m", "prompt": "x", "steps": NaN}', "steps must be an integer"),
        (b'{"model": "m", "prompt": ', "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
    ],
)
def test_no_body_is_a_500(server, data, says):
    answer = http(server[0] + "/v1/completions", data, AUTH)
    assert answer.status_code == 400 and says in answer.json()["error"]["message"]
    assert answer.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "body, path, param, says",
    [
        (dict(BODY, steps=10**12), "/v1/completions", "steps", "cap of 256 (4 per token of its max_tokens 64)"),
        (dict(BODY, colour="red"), "/v1/completions", "colour", "unknown field(s) ['colour']"),
        (dict(BODY, batch_invariant=True), "/v1/completions", "batch_invariant", "the server's to set"),
        (dict(BODY, seed=2**64), "/v1/completions", "seed", "less than or equal to"),
        (dict(BODY, top_k=10**30), "/v1/completions", "top_k", "does not fit in 64 bits"),
        (dict(BODY, response_format={"type": "json_object"}), "/v1/completions", "response_format.type", "'text'"),
        (dict(BODY, stream="yes"), "/v1/completions", "stream", "valid boolean"),
        (dict(BODY, preset="llada", steps=None, block_length=None), "/v1/completions", "preset",
         "preset 'llada' needs steps and block_length: set them beside the preset"),
        (dict(BODY, preset="llada", block_length=None), "/v1/completions", "preset", "needs block_length: set it"),
        (dict(BODY, schedule={}), "/v1/completions", None, "names it"),  # a sampler's own ValueError
        ({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "/v1/chat/completions", "messages.0.role",
         "'system', 'user' or 'assistant'"),
        ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "/v1/chat/completions", "messages.0.role",
         "'system', 'user' or 'assistant'"),
        ({"model": "m", "messages": []}, "/v1/chat/completions", "messages", "at least 1 item"),
    ],
)  # fmt: skip
def test_bad_fields_are_400s_naming_the_field(server, body, path, param, says):
    answer = http(server[0] + path, {k: v for k, v in body.items() if v is not None}, AUTH)
    error = answer.json()["error"]
    assert (answer.status_code, error["param"]) == (400, param) and says in error["message"], error


def test_model_content_type_and_open_endpoints(server):
    url, _ = server
    other = http(url + "/v1/completions", dict(BODY, model="gpt-4"), AUTH)
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"
    assert "'m'" in other.json()["error"]["message"]
    no_model = http(url + "/v1/completions", {k: v for k, v in BODY.items() if k != "model"}, AUTH)
    assert no_model.status_code == 200 and no_model.json()["model"] == "m"  # the served model, as vLLM does
    form = http(url + "/v1/completions", b"prompt=x", {"Content-Type": "application/x-www-form-urlencoded", **AUTH})
    assert form.status_code == 415 and "application/json" in form.json()["error"]["message"]
    assert http(url + "/v1/completions", BODY).status_code == 401  # the API key applies to the API
    assert http(url + "/health").json() == {"status": "ok"}  # ... not to /health nor /metrics
    assert 'hf_mdm_requests_total{endpoint="completions",status="415"} 1.0' in http(url + "/metrics").text
    missing = http(url + "/v1/nothing", BODY, AUTH)
    assert missing.status_code == 404 and missing.json()["error"]["message"] == "Not Found"


def test_a_full_queue_and_loading_say_when_to_retry(tiny):
    """One request runs (its forward held), one waits: the next is a 429 with Retry-After; while the model loads,
    a 503 with Retry-After."""
    engine, settings = engine_of(tiny["mdm"], max_queue=1, max_batch=1, scheduler="micro-batch")
    held, running_now = threading.Event(), threading.Event()

    def hold(module, args):
        running_now.set()
        held.wait(timeout=60)

    handle = engine.model.register_forward_pre_hook(hold)
    try:
        with running(build_app(engine, settings, "m")) as url, ThreadPoolExecutor(2) as pool:
            first = pool.submit(http, url + "/v1/completions", BODY)
            assert running_now.wait(timeout=60)
            second = pool.submit(http, url + "/v1/completions", BODY)
            deadline = time.monotonic() + 60
            while "hf_mdm_queue_depth 2.0" not in http(url + "/metrics").text and time.monotonic() < deadline:
                time.sleep(0.02)  # until the second request waits in the queue
            refused = _post(url, BODY)
            held.set()
            assert first.result().status_code == second.result().status_code == 200
    finally:
        held.set()
        handle.remove()
    assert refused[0] == 429 and refused[1] == "1" and "queue is full" in refused[2]
    gate = threading.Event()
    with running(build_app(None, settings, "m", loader=lambda: gate.wait(60) and engine)) as url:
        loading = _post(url, BODY)
        gate.set()
    assert loading[0] == 503 and loading[1] == "5" and "loading" in loading[2]


def _post(url: str, body: dict) -> tuple[int, str, str]:
    """(status, Retry-After, error message) of a refused request."""
    data, headers = json.dumps(body).encode(), {"Content-Type": "application/json"}
    request = urllib.request.Request(url + "/v1/completions", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, "", ""
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Retry-After", ""), err.read().decode()


def test_a_preset_builds_from_the_request_length_in_a_request_or_on_the_server(tiny):
    """``"preset": "llada"`` with its steps and block length: the text of the preset's config at the request's
    max_tokens; a server started with ``preset="llada"`` (``--preset llada``) answers a request without one alike."""
    engine, settings = engine_of(tiny["mdm"])
    body = {"prompt": "The answer is", "max_tokens": 8, "steps": 4, "block_length": 4}
    with running(build_app(engine, settings, "m")) as url:
        asked = http(url + "/v1/completions", dict(body, preset="llada")).json()["choices"][0]["text"]
    ids = engine.tokenizer(body["prompt"], add_special_tokens=False, return_tensors="pt")["input_ids"]
    config = MaskedDiffusionGenerationConfig.llada(gen_length=8, steps=4, block_length=4)
    out = engine.model.generate(ids, generation_config=config)[0, ids.shape[1] :].tolist()
    eos = engine.tokenizer.eos_token_id
    alone = engine.tokenizer.decode(out[: out.index(eos)] if eos in out else out, skip_special_tokens=True)
    assert asked == alone
    served, settings = engine_of(tiny["mdm"], preset="llada")
    with running(build_app(served, settings, "m")) as url:
        assert http(url + "/v1/completions", body).json()["choices"][0]["text"] == alone
        bad = http(url + "/v1/completions", {k: v for k, v in body.items() if k != "steps"})
    assert bad.status_code == 400 and "needs steps" in bad.json()["error"]["message"]


def test_serve_refuses_a_bad_preset_or_generation_config_in_one_line(tmp_path, capsys):
    from hf_mdm.cli import main

    assert main(["serve", str(tmp_path), "--preset", "nope"]) == 2
    assert main(["serve", str(tmp_path), "--generation-config", str(tmp_path / "missing.json")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        f"hf-mdm: error: --preset 'nope': one of {list(PRESET_NAMES)}",
        f"hf-mdm: error: --generation-config {tmp_path / 'missing.json'}: no such file or folder",
    ]
