"""A soak of ``hf-mdm serve`` as a process on a free loopback port: 200 mixed requests from 8 clients at once
(completions and chat, streamed and not, bad bodies, clients that leave mid-stream). Every good request is answered
once with 200 (a stream with one final chunk and one ``[DONE]``, last), every bad one with its 4xx, nothing with a
5xx, and the server's resident memory grows by less than a generous bound from the first half to the second."""

from __future__ import annotations

import json
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import Union

import pytest
from test_serve import events, http, start_server

from hf_mdm.harness.tiny import build_tiny_models

GROWTH_BOUND = 64 * 2**20  # bytes of resident memory the second half may add to the first
SHORT = {"max_tokens": 6, "steps": 3, "block_length": 3, "temperature": 0}
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_models(tmp_path_factory.mktemp("soak_models"))


def _plain(url: str, path: str, body: Union[dict, bytes]) -> tuple[int, int]:
    """(status, choices) of a request answered as a whole."""
    answer = http(url + path, body, timeout=120)
    return answer.status_code, len(answer.json().get("choices", []))


def _streamed(url: str, path: str, body: dict) -> tuple[int, int]:
    """(200, 1) when the stream ends with one final chunk and one [DONE], last."""
    payloads = list(events(url + path, body, timeout=120))
    finals = [p for p in payloads[:-1] if any(c.get("finish_reason") for c in json.loads(p)["choices"])]
    return 200, int(payloads.count("[DONE]") == 1 and payloads[-1] == "[DONE]" and len(finals) == 1)


def _leaves(url: str, path: str, body: dict) -> tuple[int, int]:
    """A client that reads the first chunk of a long stream and closes the connection."""
    stream = events(url + path, dict(body, max_tokens=64, steps=64, block_length=8), timeout=120)
    next(stream)
    stream.close()
    return 200, 1


# (what it is, how it is sent, its path, its body, the status it gets)
REQUESTS = [
    ("completion", _plain, "/v1/completions", dict(SHORT, prompt="The answer is"), 200),
    ("chat", _plain, "/v1/chat/completions", dict(SHORT, messages=CHAT), 200),
    ("streamed completion", _streamed, "/v1/completions", dict(SHORT, prompt="Once"), 200),
    ("streamed chat", _streamed, "/v1/chat/completions", dict(SHORT, messages=CHAT), 200),
    ("seeded", _plain, "/v1/completions", dict(SHORT, prompt="Seeded", temperature=1.0, seed=3), 200),
    ("unknown field", _plain, "/v1/completions", dict(SHORT, prompt="x", colour="red"), 400),
    ("another model", _plain, "/v1/completions", dict(SHORT, prompt="x", model="gpt-4"), 404),
    ("a wizard", _plain, "/v1/chat/completions", dict(SHORT, messages=[{"role": "wizard", "content": "x"}]), 400),
    ("not JSON", _plain, "/v1/completions", b'{"prompt": ', 400),
    ("leaves", _leaves, "/v1/completions", dict(SHORT, prompt="Long"), 200),
]


def _run(url: str, count: int) -> list[tuple[str, int, int, int]]:
    """(what, expected status, status, well formed) of ``count`` requests cycling through `REQUESTS`."""

    def send(i: int) -> tuple[str, int, int, int]:
        what, how, path, body, expected = REQUESTS[i % len(REQUESTS)]
        return (what, expected, *how(url, path, body))

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(send, range(count)))


def _resident_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_200_mixed_requests_are_each_answered_once_without_5xx_or_growth(tiny):
    process, url = start_server([tiny["mdm"], "--max-batch", "8", "--max-wait-ms", "5"])
    try:
        first = _run(url, 100)
        after_first = _resident_bytes(process.pid)
        second = _run(url, 100)
        after_second = _resident_bytes(process.pid)
        metrics = http(url + "/metrics").text
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)
    results = first + second
    wrong = [(what, expected, status) for what, expected, status, _ in results if status != expected]
    assert not wrong, wrong[:5]
    good = [r for r in results if r[1] == 200]
    assert all(well_formed == 1 for *_, well_formed in good), [r for r in good if r[3] != 1][:5]
    assert 'status="5' not in metrics
    assert 'hf_mdm_requests_total{endpoint="completions",status="404"} 20.0' in metrics
    assert 'hf_mdm_requests_total{endpoint="chat",status="400"} 20.0' in metrics
    assert after_second - after_first < GROWTH_BOUND, (after_first, after_second)
