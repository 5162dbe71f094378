"""Request bodies: exact token counts, no shared first KV block, determinism, trace prefixes.

Synthetic content is keyed by the request id (which names the phase and cell), so two requests
never share a KV block, within a cell or across the cells of one server's life."""

from __future__ import annotations

import json

import pytest

from connector_tax.loadgen.worker.prompts import (
    TOKEN_HIGH,
    TOKEN_LOW,
    TRACE_BLOCK_TOKENS,
    BodyBuilder,
    BodySettings,
    TextLayout,
    TokenPool,
)

MODEL = "Qwen/Qwen3-Coder-30B-A3B-Instruct"
KV_BLOCK = 16  # vLLM's default block size: sharing the first 16 tokens shares a cached block


@pytest.fixture(scope="module")
def builder() -> BodyBuilder:
    return BodyBuilder(BodySettings(model=MODEL), seed=11)


def _body(b: BodyBuilder, rid: str | int, n: int, out: int = 16, blocks=None) -> dict:
    return json.loads(b.body(rid if isinstance(rid, str) else f"a_r1-{rid}", n, out, blocks))


def test_token_pool_slices_are_exact() -> None:
    pool = TokenPool(seed=3, size=1000)
    ids = json.loads(b"[" + pool.text + b"]")
    assert len(ids) == 1000
    assert all(TOKEN_LOW <= t < TOKEN_HIGH for t in ids)
    for start, n in [(0, 1), (0, 1000), (17, 5), (999, 1), (500, 250)]:
        assert json.loads(b"[" + pool.slice(start, n) + b"]") == ids[start : start + n]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 15, 16, 17, 511, 512, 513, 4096, 32768])
def test_token_id_prompt_has_exactly_input_len_tokens(builder: BodyBuilder, n: int) -> None:
    body = _body(builder, 12345, n, out=77)
    assert list(body) == ["model", "prompt", "max_tokens", "temperature", "ignore_eos", "stream", "stream_options"]
    assert len(body["prompt"]) == n
    assert all(isinstance(t, int) and TOKEN_LOW <= t < TOKEN_HIGH + 2**16 for t in body["prompt"])
    assert body["model"] == MODEL
    assert body["max_tokens"] == 77
    assert body["temperature"] == 0.0
    assert body["ignore_eos"] is True
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_different_requests_never_share_a_first_block(builder: BodyBuilder) -> None:
    rids = [f"{phase}_{cell}-{i}" for phase in ("a", "b") for cell in ("r1", "r2", "256x16") for i in range(500)]
    heads = {tuple(_body(builder, rid, 64)["prompt"][:KV_BLOCK]) for rid in rids}
    assert len(heads) == len(rids) == 3000
    # Not even the first 4 tokens (the request id's head) repeat, nor a short prompt.
    assert len({h[:4] for h in heads}) == 3000
    short = {tuple(_body(builder, i, 16)["prompt"]) for i in range(300)}
    assert len(short) == 300


def test_same_index_and_seed_is_deterministic(builder: BodyBuilder) -> None:
    other = BodyBuilder(BodySettings(model=MODEL), seed=11)
    for rid, n in [("a_r1-0", 100), ("a_r1-7", 4096), ("b_x-99999", 10)]:
        assert other.body(rid, n, 8, None) == builder.body(rid, n, 8, None)
        assert builder.body(rid, n, 8, None) == builder.body(rid, n, 8, None)


def test_other_seed_gives_other_tokens(builder: BodyBuilder) -> None:
    other = BodyBuilder(BodySettings(model=MODEL), seed=12)
    a, b = _body(builder, 5, 200)["prompt"], _body(other, 5, 200)["prompt"]
    assert a[:4] != b[:4]
    assert a[4:] != b[4:]


def test_trace_bodies_share_exactly_the_equal_hash_blocks(builder: BodyBuilder) -> None:
    B = TRACE_BLOCK_TOKENS
    a = _body(builder, 0, 0, blocks=[(1, B), (2, B), (3, 100)])["prompt"]
    b = _body(builder, 1, 0, blocks=[(1, B), (2, B), (4, B)])["prompt"]
    c = _body(builder, 2, 0, blocks=[(1, B), (5, B)])["prompt"]
    d = _body(builder, 3, 0, blocks=[(9, B)])["prompt"]
    e = _body(builder, 4, 0, blocks=[(1, B), (2, 300)])["prompt"]
    assert [len(x) for x in (a, b, c, d, e)] == [2 * B + 100, 3 * B, 2 * B, B, B + 300]
    assert a[: 2 * B] == b[: 2 * B]  # hash ids 1, 2 shared
    assert a[2 * B : 2 * B + KV_BLOCK] != b[2 * B : 2 * B + KV_BLOCK]  # 3 vs 4: not even one KV block
    assert c[:B] == a[:B]
    assert c[B : B + KV_BLOCK] != a[B : B + KV_BLOCK]  # 5 vs 2
    assert d[:KV_BLOCK] != a[:KV_BLOCK]  # 9 vs 1
    assert e == a[: B + 300]  # a short last block is the head of the same block
    # The request id does not matter for trace content; the hash ids do.
    assert _body(builder, 99, 0, blocks=[(1, B)])["prompt"] == a[:B]


def test_trace_and_synthetic_prompts_do_not_collide(builder: BodyBuilder) -> None:
    synthetic = {tuple(_body(builder, i, KV_BLOCK)["prompt"]) for i in range(200)}
    trace = {tuple(_body(builder, 0, 0, blocks=[(h, KV_BLOCK)])["prompt"]) for h in range(200)}
    assert not synthetic & trace
    assert len(trace) == 200


# A server where each word is one token, the lead 2 and the rest of a prompt 3 (BOS, a template).
LAYOUT = TextLayout("Text:", tuple("the of and to in is was for on that with as by at from it an be".split()), 5)


def test_text_prompt_body() -> None:
    settings = BodySettings(model=MODEL, prompt="text", temperature=0.5, ignore_eos=False, text=LAYOUT)
    b = BodyBuilder(settings, seed=1)
    body = json.loads(b.body("a_r1-42", 30, 9, None))
    assert list(body) == ["model", "prompt", "max_tokens", "temperature", "ignore_eos", "stream", "stream_options"]
    words = body["prompt"].split(" ")
    assert words[0] == "Text:" and len(words) == 1 + 30 - 5 and set(words[1:]) <= set(LAYOUT.words)
    assert (body["max_tokens"], body["temperature"], body["ignore_eos"], body["stream"]) == (9, 0.5, False, True)
    assert body["stream_options"] == {"include_usage": True}
    # Another key, another prompt from its first block on; the same key, the same prompt.
    other = json.loads(b.body("a_r1-43", 30, 9, None))["prompt"].split(" ")
    assert other[1:17] != words[1:17]
    assert json.loads(BodyBuilder(settings, seed=1).body("a_r1-42", 30, 9, None))["prompt"].split(" ") == words
    # Long prompts: the pool's words after the key's own.
    long = json.loads(b.body("a_r1-44", 5000, 9, None))["prompt"].split(" ")
    assert len(long) == 1 + 5000 - 5 and set(long[1:]) <= set(LAYOUT.words)


def test_text_prompts_need_the_servers_sizing() -> None:
    with pytest.raises(ValueError, match="sizing"):
        BodyBuilder(BodySettings(model=MODEL, prompt="text"), seed=1)


def test_chat_body() -> None:
    b = BodyBuilder(BodySettings(model=MODEL, endpoint="chat", text=LAYOUT), seed=1)
    body = json.loads(b.body("b_c-7", 12, 64, None))
    assert list(body) == ["model", "messages", "max_tokens", "temperature", "ignore_eos", "stream", "stream_options"]
    assert len(body["messages"]) == 1
    assert list(body["messages"][0]) == ["role", "content"]
    assert body["messages"][0]["role"] == "user"
    assert body["messages"][0]["content"].split(" ")[0] == "Text:"
    assert len(body["messages"][0]["content"].split(" ")) == 1 + 12 - 5
    assert (body["max_tokens"], body["temperature"], body["ignore_eos"], body["stream"]) == (64, 0.0, True, True)
    assert body["stream_options"] == {"include_usage": True}


def test_non_streaming_body_has_no_stream_options() -> None:
    b = BodyBuilder(BodySettings(model='we"ird\\model', stream=False), seed=1)
    body = json.loads(b.body("a_r1-0", 3, 1, None))
    assert list(body) == ["model", "prompt", "max_tokens", "temperature", "ignore_eos", "stream"]
    assert body["model"] == 'we"ird\\model'
    assert body["stream"] is False
    assert len(body["prompt"]) == 3
