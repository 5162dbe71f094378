"""What the `ctax sim` API tests share: the servers (module-scoped fixtures), the body shapes of
vLLM 0.33.0's OpenAI server (vllm/entrypoints/), and small request helpers."""

from __future__ import annotations

import re
from typing import Any

import httpx
from sim_server import (
    MODEL,
)

SMALL_LEN = 4096
COMPLETION_KEYS = [
    "id",
    "object",
    "created",
    "model",
    "choices",
    "service_tier",
    "system_fingerprint",
    "usage",
    "kv_transfer_params",
    "ec_transfer_params",
    "metrics",
]
COMPLETION_CHOICE_KEYS = [
    "index",
    "text",
    "logprobs",
    "finish_reason",
    "stop_reason",
    "token_ids",
    "prompt_logprobs",
    "prompt_token_ids",
    "routed_experts",
    "weight_versions",
]
FULL_USAGE_KEYS = [
    "prompt_tokens",
    "total_tokens",
    "completion_tokens",
    "prompt_tokens_details",
    "completion_tokens_details",
]
USAGE_KEYS = ["prompt_tokens", "total_tokens", "completion_tokens"]
STREAM_CHOICE_KEYS = [
    "index",
    "text",
    "logprobs",
    "finish_reason",
    "stop_reason",
    "prompt_token_ids",
    "token_ids",
    "weight_versions",
]
HEAD_KEYS = ["id", "object", "created", "model", "choices"]
FINGERPRINT_RE = re.compile(r"vllm-0\.33\.0-[0-9a-f]{8}")


def token_prompt(n: int, offset: int = 0) -> list[int]:
    return [(offset + 7 * i) % 30000 + 1 for i in range(n)]


def usage_of(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}


def completion(client: httpx.Client, **body: Any) -> httpx.Response:
    return client.post("/v1/completions", json={"model": MODEL, **body})


def assert_healthy(client: httpx.Client) -> None:
    response = client.get("/health")
    assert response.status_code == 200
    assert response.content == b""


CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}]
