"""Faults and stops: a forward that raises for one request of a batch fails that request only (a 500 with OpenAI's
error object, or an error event and ``[DONE]`` when streamed), the others of the batch get what they get alone, the
500s are counted and the server stays healthy; ``hf-mdm serve`` as a process drains on SIGTERM and Ctrl-C (a stream
in flight ends with its final chunk and ``[DONE]``, a request sent meanwhile gets 503, the process exits 0); a model
that cannot load ends the command with one error line. Every server binds a free loopback port; every wait is
bounded and waits for an event (a chunk, a status), never for a fixed time."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_serve import ENV, direct, engine_of, events, http, start_server

from hf_mdm.harness.tiny import build_tiny_models
from hf_mdm.serve import build_app, running
from hf_mdm.serve.runner import free_port

TRIGGER = "\x01"  # a byte the tiny models never write: a prompt holding it makes the forward raise
BODY = {"max_tokens": 8, "steps": 4, "block_length": 4, "temperature": 0}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_models(tmp_path_factory.mktemp("fault_models"))


@pytest.mark.parametrize("scheduler", ["join", "micro-batch"])
def test_a_failing_forward_fails_only_its_request(tiny, scheduler):
    """Three requests fill one batch (a cohort when joining; max_batch 3, no deadline); the forward raises on the
    batch holding TRIGGER, so each request runs again alone: the faulty one fails, the others answer as
    ``generate`` does alone."""
    engine, settings = engine_of(tiny["mdm"], max_batch=3, max_wait_ms=600_000.0, scheduler=scheduler)
    (trigger,) = engine.tokenizer(TRIGGER, add_special_tokens=False)["input_ids"]

    def fault(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and bool((ids == trigger).any()):
            raise RuntimeError("injected fault")

    handle = engine.model.register_forward_pre_hook(fault, with_kwargs=True)
    good = ["The answer is", "Once upon a time"]
    url_of = "{}/v1/completions".format
    engine.batches = []
    try:
        with running(build_app(engine, settings, "m")) as url, ThreadPoolExecutor(3) as pool:
            plain = list(pool.map(lambda p: http(url_of(url), {"prompt": p, **BODY}), [TRIGGER + "x", *good]))
            streamed = pool.submit(lambda: list(events(url_of(url), {"prompt": TRIGGER + "x", **BODY})))
            good_streamed = pool.submit(lambda: list(events(url_of(url), {"prompt": good[0], **BODY})))
            good_plain = http(url_of(url), {"prompt": good[1], **BODY})
            streamed, good_streamed = streamed.result(timeout=120), good_streamed.result(timeout=120)
            metrics, health = http(url + "/metrics").text, http(url + "/health")
        alone = [direct(engine, p, max_tokens=8, steps=4, block_length=4) for p in good]
    finally:
        handle.remove()
    error = plain[0].json()["error"]
    assert plain[0].status_code == 500 and error["type"] == "server_error" and "injected fault" in error["message"]
    assert [r.json()["choices"][0]["text"] for r in plain[1:]] == alone
    assert json.loads(streamed[0])["error"]["type"] == "server_error" and streamed[1:] == ["[DONE]"]
    assert _joined(good_streamed) == alone[0] and good_plain.json()["choices"][0]["text"] == alone[1]
    assert sorted(len(batch) for batch in engine.batches) == [1] * 6 + [3] * 2  # each batch failed, then each alone
    assert [len(batch) for batch in engine.batches][::4] == [3, 3]
    assert 'hf_mdm_requests_total{endpoint="completions",status="500"} 2.0' in metrics
    assert 'hf_mdm_requests_total{endpoint="completions",status="200"} 4.0' in metrics
    assert health.json() == {"status": "ok"}


def _joined(payloads: list[str]) -> str:
    assert payloads[-1] == "[DONE]" and json.loads(payloads[-2])["choices"][0]["finish_reason"] in ("stop", "length")
    return "".join(json.loads(p)["choices"][0]["text"] for p in payloads[:-1])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_drains_streams_and_refuses_new_requests(tiny, sig):
    """A request held in flight (its body half sent) and a streamed one, the signal after the stream's first chunk:
    a request sent during the drain gets 503, the stream ends with its final chunk and [DONE], the held request is
    answered once its body arrives, and the process exits 0. The server runs with ``--preset llada`` (a request
    without llada's steps is told to send them)."""
    process, url = start_server([tiny["mdm"], "--preset", "llada"])
    try:
        needs = http(url + "/v1/completions", {"prompt": "x", "max_tokens": 8})
        assert needs.status_code == 400 and "needs steps and block_length" in needs.json()["error"]["message"]
        held, rest = _hold(url, {"prompt": "held", **BODY})
        _wait_for(lambda: "hf_mdm_requests_in_flight 1.0" in http(url + "/metrics").text)
        stream = events(url + "/v1/completions", {"prompt": "x", "max_tokens": 128, "steps": 128, "block_length": 8})
        payloads = [next(stream)]  # the first chunk: the stream is in flight
        process.send_signal(sig)
        _wait_for(lambda: http(url + "/health").status_code == 503)
        refused = http(url + "/v1/completions", {"prompt": "x", **BODY})
        payloads += list(stream)
        held.sendall(rest)
        answer = held.makefile("rb").read().decode()
        assert process.wait(timeout=120) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)
    assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
    assert payloads[-1] == "[DONE]", payloads[-2:]
    assert json.loads(payloads[-2])["choices"][0]["finish_reason"] in ("stop", "length"), payloads[-2:]
    assert answer.startswith("HTTP/1.1 200") and '"finish_reason"' in answer


def _hold(url: str, body: dict) -> tuple[socket.socket, bytes]:
    """A POST whose body is sent but for its last bytes (returned): in flight until they are sent."""
    data = json.dumps(body).encode()
    head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
    parts = urllib.parse.urlsplit(url)
    held = socket.create_connection((parts.hostname, parts.port), timeout=120)
    held.sendall(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data[:-2])
    return held, data[-2:]


def _wait_for(condition, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_model_that_cannot_load_ends_the_command_with_one_line(tmp_path):
    missing = tmp_path / "nope"
    command = [sys.executable, "-m", "hf_mdm.cli", "serve", str(missing), "--port", str(free_port())]
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=180)
    errors = [line for line in done.stderr.splitlines() if line.startswith("hf-mdm:")]  # the command's own lines
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(errors) == 1 and errors[0].startswith(f"hf-mdm: error: cannot load the model '{missing}': ")
