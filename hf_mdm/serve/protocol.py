"""The OpenAI protocol as this server speaks it: the request bodies of ``/v1/completions`` and
``/v1/chat/completions`` as pydantic models (an unknown field, a wrong type or an unsupported value is a 400 naming
the field), what a request asks (`Asked`), and the bodies the server answers with (completions, chat completions,
their stream chunks, usage, the model list and the error object).

A request's sampler settings are explicit optional fields: ``MaskedDiffusionGenerationConfig``'s diffusion fields
(`hf_mdm.generation_config.DIFFUSION_FIELDS`) plus ``top_k`` and ``preset``; their values are checked as
``generate`` checks them, when the engine builds the request's config (`hf_mdm.serve.engine`).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from ..generation_config import DIFFUSION_FIELDS

__all__ = ["ApiError", "Asked", "parse_request", "SETTING_FIELDS", "Usage", "answer_body", "Chunks", "model_list"]

# the request's fields that are sampler settings (MaskedDiffusionGenerationConfig's), plus "top_k" and "preset"
SETTING_FIELDS = frozenset(DIFFUSION_FIELDS) | {"top_k", "preset"}
NOT_SETTINGS = frozenset({"batch_invariant", "return_dict_in_generate", "output_history", "compile_forward"})
# OpenAI fields accepted only at their neutral value: (neutral values, what to say otherwise)
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
    "parallel_tool_calls": ((None, False, True), "parallel_tool_calls must be true or false"),
}
MAX_SEED = 2**63 - 1  # a torch generator's seed, and the largest integer setting


class ApiError(Exception):
    """An error the client gets as OpenAI's error object, with its HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        param: Optional[str] = None,
        kind: str = "invalid_request_error",
        code: Optional[str] = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        error = ErrorObject(message=self.message, type=self.kind, param=self.param, code=self.code)
        return ErrorResponse(error=error).model_dump()


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
    model: Optional[str] = None


# ---------------------------------------------------------------------------------------------------------------
# requests


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: Optional[bool] = None


class ResponseFormat(_Strict):
    type: Literal["text"]


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str
    name: Optional[str] = None


PositiveInt = Annotated[Optional[int], Field(gt=0)]


class _OpenAIFields(_Strict):
    """The OpenAI fields both endpoints take (those only at a neutral value are `NEUTRAL`'s)."""

    model: Optional[str] = None
    max_tokens: PositiveInt = None
    max_completion_tokens: PositiveInt = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    stop: Optional[Union[str, list[str]]] = None
    stream: Optional[bool] = None
    stream_options: Optional[StreamOptions] = None
    seed: Annotated[Optional[int], Field(ge=0, le=MAX_SEED)] = None
    user: Optional[str] = None
    response_format: Optional[ResponseFormat] = None
    metadata: Optional[dict[str, str]] = None
    store: Optional[bool] = None

    @field_validator(*NEUTRAL, check_fields=False)
    @classmethod
    def _neutral(cls, value: Any, info: Any) -> Any:
        neutral, why = NEUTRAL[info.field_name]
        if value not in neutral:
            raise ValueError(why)
        return value

    @field_validator(*NOT_SETTINGS, check_fields=False)
    @classmethod
    def _not_a_setting(cls, value: Any, info: Any) -> Any:
        raise ValueError(f"{info.field_name} is the server's to set, not a request's")

    @field_validator(*SETTING_FIELDS, check_fields=False)
    @classmethod
    def _in_64_bits(cls, value: Any, info: Any) -> Any:
        if isinstance(value, int) and not -MAX_SEED - 1 <= value <= MAX_SEED:
            raise ValueError(f"{info.field_name} {value} does not fit in 64 bits")
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _stops(cls, value: Any) -> Any:
        stops = [] if value is None else [value] if isinstance(value, str) else value
        if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
            raise ValueError("stop must be a non-empty string or a list of up to 4 of them")
        return value

    def asked(self, chat: bool, prompt: Any) -> Asked:
        stops = [] if self.stop is None else [self.stop] if isinstance(self.stop, str) else list(self.stop)
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        settings = {k: v for k, v in self if k in SETTING_FIELDS | {"temperature", "top_p"} and v is not None}
        include_usage = bool(self.stream_options and self.stream_options.include_usage)
        return Asked(chat, prompt, max_tokens, stops, bool(self.stream), include_usage, self.seed, settings, self.model)


# the sampler settings (and the fields refused as the server's or only taken at a neutral value) as explicit
# optional fields, their values checked by the engine as generate checks them
_Fields = create_model(
    "_Fields",
    __base__=_OpenAIFields,
    **{name: (Optional[Any], None) for name in sorted(SETTING_FIELDS | NOT_SETTINGS | set(NEUTRAL))},
)


class CompletionRequest(_Fields):
    """The body of ``/v1/completions``: one prompt."""

    prompt: str

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if not isinstance(value, str):
            raise ValueError("prompt must be a string (one prompt per request)")
        return value


class ChatCompletionRequest(_Fields):
    """The body of ``/v1/chat/completions``: the messages, rendered by the tokenizer's chat template."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]


def parse_request(body: Union[bytes, str, dict], chat: bool, served: Optional[str] = None) -> Asked:
    """What the request ``body`` (its JSON text, or the parsed object) of ``/v1/chat/completions`` (``chat``) or
    ``/v1/completions`` asks; an `ApiError` 400 naming the field for anything unsupported, unknown or malformed,
    404 when it names a ``model`` other than ``served`` (a request without ``model`` asks for the served one)."""
    kind = ChatCompletionRequest if chat else CompletionRequest
    try:
        request = kind.model_validate_json(body) if isinstance(body, (bytes, str)) else kind.model_validate(body)
    except ValidationError as err:
        raise _bad_request(err) from None
    if served is not None and request.model not in (None, served):
        raise ApiError(404, f"the model {request.model!r} does not exist: this server serves {served!r}", "model",
                       code="model_not_found")  # fmt: skip
    if chat:
        return request.asked(True, [m.model_dump(include={"role", "content"}) for m in request.messages])
    return request.asked(False, request.prompt)


def _bad_request(err: ValidationError) -> ApiError:
    """The 400 of a body that fails validation: its first problem, naming the field (``param``)."""
    errors = err.errors(include_url=False, include_input=False)
    unknown = [str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden" and len(e["loc"]) == 1]
    if unknown:
        message = f"unknown field(s) {unknown}: sampler settings are {sorted(SETTING_FIELDS - NOT_SETTINGS)}"
        return ApiError(400, message, unknown[0])
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"])
    if first["type"] == "json_invalid":
        return ApiError(400, f"the body is not valid JSON: {first['msg'].removeprefix('Invalid JSON: ')}")
    if first["type"] == "model_type" and not where:
        return ApiError(400, "the request body must be a JSON object")
    if first["type"] == "missing":
        return ApiError(400, f"{where} is required", where)
    if first["type"] == "value_error":
        return ApiError(400, str(first["ctx"]["error"]), where)
    return ApiError(400, f"{where}: {first['msg']}", where)


# ---------------------------------------------------------------------------------------------------------------
# responses


class ErrorObject(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    error: ErrorObject


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, answer: Any) -> "Usage":
        """The usage of an `hf_mdm.serve.engine.Answer`."""
        total = answer.prompt_tokens + answer.completion_tokens
        return cls(prompt_tokens=answer.prompt_tokens, completion_tokens=answer.completion_tokens, total_tokens=total)


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: Optional[str] = None
    logprobs: None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str
    logprobs: None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: dict[str, str]
    finish_reason: Optional[str] = None
    logprobs: None = None


class _Body(BaseModel):
    id: str
    object: str
    created: int
    model: str
    choices: list[Union[CompletionChoice, ChatChoice, ChatChunkChoice]]
    usage: Optional[Usage] = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "hf_mdm"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def model_list(name: str) -> dict:
    return ModelList(data=[ModelCard(id=name)]).model_dump()


def _ident(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"


def answer_body(answer: Any, asked: Asked, model_name: str) -> dict:
    """The body of a whole answer (an `hf_mdm.serve.engine.Answer`): a chat completion or a text completion."""
    if asked.chat:
        message = AssistantMessage(content=answer.text)
        choice: Any = ChatChoice(message=message, finish_reason=answer.finish_reason)
    else:
        choice = CompletionChoice(text=answer.text, finish_reason=answer.finish_reason)
    kind = "chat.completion" if asked.chat else "text_completion"
    body = _Body(id=_ident(asked.chat), object=kind, created=int(time.time()), model=model_name, choices=[choice],
                 usage=Usage.of(answer))  # fmt: skip
    return body.model_dump()


class Chunks:
    """The JSON of a stream's chunks, one id for the stream: as OpenAI streams a chat completion (a first chunk with
    the role, deltas of content, the finish reason, optional usage) or a text completion (text pieces)."""

    def __init__(self, asked: Asked, model_name: str):
        self.chat, self.model = asked.chat, model_name
        self.ident, self.created = _ident(asked.chat), int(time.time())

    def _json(self, choices: list, usage: Optional[Usage] = None) -> str:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        body = _Body(id=self.ident, object=kind, created=self.created, model=self.model, choices=choices, usage=usage)
        return body.model_dump_json()

    def role(self) -> str:
        return self._json([ChatChunkChoice(delta={"role": "assistant", "content": ""})])

    def text(self, text: str, reason: Optional[str] = None) -> str:
        if self.chat:
            return self._json([ChatChunkChoice(delta={"content": text} if text else {}, finish_reason=reason)])
        return self._json([CompletionChoice(text=text, finish_reason=reason)])

    def usage(self, answer: Any) -> str:
        return self._json([], Usage.of(answer))
