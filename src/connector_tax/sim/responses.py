"""Response bodies and SSE chunks, field for field as vLLM 0.33's OpenAI server writes them.

Key order and which nulls appear follow vLLM's pydantic models as dumped by its serving code
(exclude_unset for stream chunks, everything for whole responses); see the sim README.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def sse(obj: Any) -> bytes:
    return f"data: {dumps(obj)}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class ResponseIds:
    response_id: str
    created: int
    model: str
    chat: bool
    fingerprint: str

    def head(self, object_name: str | None = None) -> dict[str, Any]:
        if object_name is None:
            object_name = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.response_id, "object": object_name, "created": self.created, "model": self.model}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def role_chunk(ids: ResponseIds, chunk_usage: dict[str, int] | None) -> bytes:
    choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    body: dict[str, Any] = {**ids.head(), "choices": [choice]}
    if chunk_usage is not None:
        body["usage"] = chunk_usage
    body["prompt_token_ids"] = None
    body["prompt_text"] = None
    return sse(body)


def text_chunk(
    ids: ResponseIds,
    text: str,
    finish_reason: str | None,
    chunk_usage: dict[str, int] | None,
    usage_follows: bool,
) -> bytes:
    """One content chunk; the last one carries finish_reason (vLLM has no separate finish chunk)."""
    last = finish_reason is not None
    if ids.chat:
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {"content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        if last:
            choice["stop_reason"] = None
        choice["token_ids"] = None
        if last:
            choice["weight_versions"] = None
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "prompt_token_ids": None,
            "token_ids": None,
            "weight_versions": None,
        }
    body: dict[str, Any] = {**ids.head(), "choices": [choice]}
    if chunk_usage is not None:
        body["usage"] = chunk_usage
    if last and not usage_follows:
        body["system_fingerprint"] = ids.fingerprint
    body["kv_transfer_params"] = None
    return sse(body)


def usage_chunk(ids: ResponseIds, final_usage: dict[str, int]) -> bytes:
    return sse({**ids.head(), "choices": [], "usage": final_usage, "system_fingerprint": ids.fingerprint})


def full_response(ids: ResponseIds, text: str, finish_reason: str, final_usage: dict[str, int]) -> bytes:
    full_usage = {**final_usage, "prompt_tokens_details": None, "completion_tokens_details": None}
    if ids.chat:
        message = {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        }
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "token_ids": None,
            "routed_experts": None,
            "weight_versions": None,
        }
        body: dict[str, Any] = {
            **ids.head("chat.completion"),
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": ids.fingerprint,
            "usage": full_usage,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "prompt_text": None,
        }
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "token_ids": None,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "routed_experts": None,
            "weight_versions": None,
        }
        body = {
            **ids.head("text_completion"),
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": ids.fingerprint,
            "usage": full_usage,
        }
    body.update({"kv_transfer_params": None, "ec_transfer_params": None, "metrics": None})
    return dumps(body).encode()


def models_body(model: str, root: str, max_model_len: int, permission_id: str) -> bytes:
    created = int(time.time())
    permission = {
        "id": permission_id,
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": root,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [permission],
    }
    return dumps({"object": "list", "data": [card]}).encode()
