"""An OpenAI request body, checked: what it asks (prompt or messages, length, stops, seed, streaming) and the
diffusion settings its extra fields carry. Anything the server does not do is a 400 that says so, never a 500."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..generation_config import DIFFUSION_FIELDS

__all__ = ["ApiError", "Asked", "parse_request", "SETTING_FIELDS"]

# the request's extra fields that are sampler settings (MaskedDiffusionGenerationConfig's), plus "preset"
SETTING_FIELDS = frozenset(DIFFUSION_FIELDS) | {"top_k", "preset"}
NOT_SETTINGS = frozenset({"batch_invariant", "return_dict_in_generate", "output_history", "compile_forward"})
OPENAI_FIELDS = {"model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "stream", "seed"}
OPENAI_FIELDS |= {"stream_options", "user", "n", "logprobs", "top_logprobs", "echo", "best_of", "presence_penalty"}
OPENAI_FIELDS |= {"frequency_penalty", "logit_bias", "tools", "tool_choice", "functions", "function_call", "suffix"}
OPENAI_FIELDS |= {"response_format", "parallel_tool_calls", "metadata", "store"}
# fields accepted only at their neutral value: (neutral values, what to say)
NEUTRAL = {
    "n": ((None, 1), "n > 1 is not supported: send one request per completion"),
    "best_of": ((None, 1), "best_of > 1 is not supported"),
    "logprobs": ((None, False, 0), "logprobs are not supported by diffusion sampling here"),
    "top_logprobs": ((None, 0), "top_logprobs are not supported"),
    "echo": ((None, False), "echo is not supported"),
    "presence_penalty": ((None, 0, 0.0), "presence_penalty is not supported"),
    "frequency_penalty": ((None, 0, 0.0), "frequency_penalty is not supported"),
    "logit_bias": ((None,), "logit_bias is not supported"),
    "tools": ((None,), "tools are not supported"),
    "tool_choice": ((None, "none"), "tool_choice is not supported"),
    "functions": ((None,), "functions are not supported"),
    "function_call": ((None, "none"), "function_call is not supported"),
    "suffix": ((None, ""), "suffix (insertion) is not supported: put [MASK] tokens in the prompt instead"),
    "parallel_tool_calls": ((None, False, True), ""),
}


class ApiError(Exception):
    """An error the client gets as OpenAI's error object, with its HTTP status."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


@dataclass
class Asked:
    """What one request asks for."""

    chat: bool
    prompt: Any  # a string (completions) or the messages (chat)
    max_tokens: Optional[int]
    stop: list[str]
    stream: bool
    include_usage: bool
    seed: Optional[int]
    settings: dict[str, Any] = field(default_factory=dict)  # sampler settings (temperature, steps, preset, ...)


def parse_request(body: Any, chat: bool) -> Asked:
    """The request ``body`` (parsed JSON) of ``/v1/chat/completions`` (``chat``) or ``/v1/completions``; an
    `ApiError` (400) naming the field for anything unsupported, unknown or malformed."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - OPENAI_FIELDS - SETTING_FIELDS - {"messages", "prompt"})
    if unknown:
        raise ApiError(400, f"unknown field(s) {unknown}: sampler settings are {sorted(SETTING_FIELDS)}", unknown[0])
    for name in sorted(set(body) & NOT_SETTINGS):
        raise ApiError(400, f"{name} is the server's to set, not a request's", name)
    for name, (neutral, why) in NEUTRAL.items():
        if name in body and body[name] not in neutral:
            raise ApiError(400, why or f"{name} is not supported", name)
    prompt = _messages(body) if chat else _prompt(body)
    stream = _flag(body, "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", "stream_options")
    settings = {k: v for k, v in body.items() if k in SETTING_FIELDS or k in ("temperature", "top_p")}
    settings = {k: v for k, v in settings.items() if v is not None}
    return Asked(chat, prompt, _max_tokens(body), _stops(body), stream, bool(options.get("include_usage")),
                 _seed(body), settings)  # fmt: skip


def _prompt(body: dict) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ApiError(400, "prompt must be a string (one prompt per request)", "prompt")
    return prompt


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    ok = isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages)
    if not ok or not all(isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages):
        raise ApiError(400, "messages must be a non-empty list of {role, content} with string content", "messages")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _max_tokens(body: dict) -> Optional[int]:
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ApiError(400, f"{name} must be a positive integer, got {value!r}", name)
    return value


def _stops(body: dict) -> list[str]:
    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
        raise ApiError(400, "stop must be a non-empty string or a list of up to 4 of them", "stop")
    return stops


def _seed(body: dict) -> Optional[int]:
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ApiError(400, f"seed must be a non-negative integer, got {seed!r}", "seed")
    return seed


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"{name} must be true or false", name)
    return bool(value)
