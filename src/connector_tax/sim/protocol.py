"""OpenAI-protocol request parsing and vLLM-shaped errors for the simulated server.

Only what the study and a careful client use is modelled; anything else in a request body is
ignored, as vLLM ignores fields it does not know. Length rules follow vLLM 0.33: a prompt
longer than max_model_len and a max_tokens above max_model_len are 400s, while a prompt plus
max_tokens that together overflow the context clamp max_tokens to what is left. Schema
failures use FastAPI's validation-error form as vLLM rewrites it, vLLM's own checks the
`(parameter=...)` form.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from connector_tax.sim.tokens import chat_prompt, tokenize


class ApiError(Exception):
    def __init__(
        self,
        message: str,
        status: HTTPStatus = HTTPStatus.BAD_REQUEST,
        err_type: str = "BadRequestError",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.err_type = err_type
        self.param = param

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.err_type, "param": self.param, "code": int(self.status)}
        return json.dumps({"error": error}, separators=(",", ":")).encode()


def vllm_error(message: str, param: str, value: Any = None) -> ApiError:
    """vLLM's own checks (VLLMValidationError): type BadRequestError, parameter in the text."""
    suffix = f"parameter={param}" if value is None else f"parameter={param}, value={value}"
    return ApiError(f"{message} ({suffix})", param=param)


def _summary(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return f"<{type(value).__name__} of {len(value)} items>"
    return str(value)


def validation_error(kind: str, loc: str, msg: str, value: Any, **ctx: str) -> ApiError:
    """A request that fails schema validation: FastAPI's RequestValidationError as vLLM
    rewrites it (400, type "Bad Request", the pydantic error dict in the message)."""
    err: dict[str, Any] = {"type": kind, "loc": loc, "msg": msg, "input": _summary(value)}
    if ctx:
        err["ctx"] = ctx
    return ApiError(f"1 validation error:\n  {err}", err_type="Bad Request", param=loc)


ENGINE_DEAD = ApiError(
    "The server had an error while processing your request.",
    HTTPStatus.INTERNAL_SERVER_ERROR,
    "InternalServerError",
)


@dataclass(frozen=True)
class GenerationRequest:
    chat: bool
    prompt_token_ids: list[int]
    max_tokens: int
    ignore_eos: bool
    temperature: float
    stream: bool
    include_usage: bool
    continuous_usage: bool


_WORDS = {int: "integer", float: "number", str: "string", bool: "boolean", dict: "dictionary"}
_TRUE, _FALSE = {"true", "1", "yes", "on", "t", "y"}, {"false", "0", "no", "off", "f", "n"}


def _lax(key: str, value: Any, kind: type) -> Any:
    """Coerce as pydantic's lax mode does for a request model (e.g. "8" is a valid int)."""
    word = _WORDS[kind]
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        raise validation_error(
            "bool_parsing", f"body.{key}", "Input should be a valid boolean, unable to interpret input", value
        )
    if isinstance(value, bool) and kind is not str:
        return int(value) if kind is int else float(value)
    if kind is int:
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                raise validation_error(
                    "int_parsing",
                    f"body.{key}",
                    "Input should be a valid integer, unable to parse string as an integer",
                    value,
                ) from None
    if kind is float:
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                raise validation_error(
                    "float_parsing",
                    f"body.{key}",
                    "Input should be a valid number, unable to parse string as a number",
                    value,
                ) from None
    if isinstance(value, kind):
        return value
    raise validation_error(f"{word}_type", f"body.{key}", f"Input should be a valid {word}", value)


def _typed(body: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = body.get(key)
    return default if value is None else _lax(key, value, kind)


MISSING_PROMPT = "Either prompt or prompt_embeds must be provided and non-empty."


def _prompt_token_ids(prompt: Any) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        ids = tokenize(prompt)
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise vllm_error("The simulator serves one prompt per request.", "prompt")
    else:
        raise validation_error("string_type", "body.prompt", "Input should be a valid string", prompt)
    if not ids:
        raise vllm_error(MISSING_PROMPT, "prompt")
    if any(t < 0 for t in ids):
        raise validation_error(
            "greater_than_equal", "body.prompt", "Input should be greater than or equal to 0", prompt
        )
    return list(ids)


def _chat_token_ids(messages: Any) -> list[int]:
    if not isinstance(messages, list) or not messages:
        raise validation_error("list_type", "body.messages", "Input should be a valid list", messages)
    rendered: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise validation_error("missing", f"body.messages.{i}.role", "Field required", message)
        content = message.get("content", "")
        if isinstance(content, list):  # content parts: keep the text ones
            texts = [p.get("text", "") for p in content if isinstance(p, dict)]
            if not all(isinstance(t, str) for t in texts):
                raise validation_error(
                    "string_type", f"body.messages.{i}.content", "Input should be a valid string", content
                )
            content = "".join(texts)
        if not isinstance(content, str):
            raise validation_error(
                "string_type", f"body.messages.{i}.content", "Input should be a valid string", content
            )
        rendered.append({"role": message["role"], "content": content})
    return tokenize(chat_prompt(rendered))


def _decode(raw: bytes, content_type: str | None) -> dict[str, Any]:
    if content_type is None or content_type.split(";")[0].strip().lower() != "application/json":
        raise ApiError(
            "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed", err_type="Bad Request"
        )
    if not raw.strip():
        raise validation_error("missing", "body", "Field required", None)
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise validation_error("json_invalid", f"body.{exc.pos}", "JSON decode error", {}, error=exc.msg) from None
    except UnicodeDecodeError:
        raise validation_error("json_invalid", "body", "JSON decode error", {}, error="invalid UTF-8") from None
    except RecursionError:  # what FastAPI answers when its own parse blows up
        raise ApiError("There was an error parsing the body", err_type="Bad Request") from None
    if not isinstance(body, dict):
        raise validation_error(
            "model_attributes_type",
            "body",
            "Input should be a valid dictionary or object to extract fields from",
            body,
        )
    return body


def parse_generation(
    raw: bytes, content_type: str | None, chat: bool, served_model: str, max_model_len: int
) -> GenerationRequest:
    """Checks run in vLLM's order: schema and model validators, the model name (404),
    then prompt length, then sampling parameters."""
    body = _decode(raw, content_type)
    model = _typed(body, "model", str, None)
    n = _typed(body, "n", int, 1)
    temperature = _typed(body, "temperature", float, 1.0)
    stream = _typed(body, "stream", bool, False)
    ignore_eos = _typed(body, "ignore_eos", bool, False)
    options = _typed(body, "stream_options", dict, None)
    if chat:
        max_tokens = _typed(body, "max_tokens", int, _typed(body, "max_completion_tokens", int, None))
        if "messages" not in body:
            raise validation_error("missing", "body.messages", "Field required", body)
        ids = _chat_token_ids(body["messages"])
    else:
        max_tokens = _typed(body, "max_tokens", int, 16)
        if body.get("prompt") in (None, ""):
            raise vllm_error(MISSING_PROMPT, "prompt")
        ids = _prompt_token_ids(body["prompt"])
    if options is not None:
        if not stream:
            raise vllm_error("Stream options can only be defined when `stream=True`.", "stream_options")
        for key in ("include_usage", "continuous_usage_stats"):
            if options.get(key) is not None:
                options[key] = _lax(f"stream_options.{key}", options[key], bool)
    options = options or {}

    if model and model != served_model:
        raise ApiError(
            f"The model `{model}` does not exist. Valid aliases: {served_model}.",
            status=HTTPStatus.NOT_FOUND,
            err_type="NotFoundError",
            param="model",
        )
    if n != 1:
        raise vllm_error("The simulator serves n=1 only.", "n")
    if temperature < 0:
        raise vllm_error(f"temperature must be non-negative, got {temperature}.", "temperature", temperature)
    if max_tokens is not None and max_tokens > max_model_len:
        raise vllm_error(
            f"max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            "max_tokens",
            max_tokens,
        )
    if len(ids) > max_model_len:
        raise vllm_error(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {len(ids)} input tokens, which exceeds this limit even without "
            "any output tokens. Please reduce the length of the input prompt.",
            "input_tokens",
            len(ids),
        )
    room = max_model_len - len(ids)
    max_tokens = room if max_tokens is None else min(max_tokens, room)
    if max_tokens < 1:
        raise vllm_error(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens)

    include_usage = bool(options.get("include_usage", False))
    return GenerationRequest(
        chat=chat,
        prompt_token_ids=ids,
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
        temperature=temperature,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=include_usage and bool(options.get("continuous_usage_stats", False)),
    )
