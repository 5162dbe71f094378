"""Move one request's KV cache from a prefill server to a decode server, as vLLM's
disaggregated-prefill proxies do, and show what moved.

    python tools/pd_transfer.py --connector nixl|mooncake --prefill URL --decode URL \
        --model NAME [--prompt-ids 1,2,...] [--max-tokens 16] [--bootstrap URL] [--out FILE]

The handshake, read from vLLM 0.32/0.33's connectors (the scheduler sides' get_num_new_matched_tokens
and request_finished) and the proxies its docs point to (tests/v1/kv_connector/nixl_integration/
toy_proxy_server.py for both):

* NIXL (pull): the prefill server gets the request with max_tokens 1 and kv_transfer_params
  {"do_remote_decode": true}; its response carries kv_transfer_params (remote_engine_id,
  remote_block_ids, remote_host, remote_port, ...), which the decode server gets with the full
  request: it reads the blocks from the prefill server's NIXL agent and decodes from there.
* Mooncake: the proxy names the transfer (transfer_id) and gives the prefill server
  {"do_remote_decode": true, "transfer_id": T} and the decode server {"do_remote_prefill": true,
  "transfer_id": T, "remote_engine_id": E, "remote_bootstrap_addr": B}, where B is the prefill
  server's bootstrap server (VLLM_MOONCAKE_BOOTSTRAP_PORT) and E the engine id its /query lists.
  The prefill server holds the blocks after its one-token answer until the decode server asks.

Both servers are asked the same greedy request on their own first (a different prompt, so that
neither caches the transfer prompt's blocks) to show they hold the same dummy weights, and the
prefill server alone answers the transfer prompt as the single-server reference. What moved is read
from the decode server's /metrics: `vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}`
(prompt tokens that came from a KV transfer) against `local_compute`, and NIXL's bytes counter.

Prints one JSON object (and writes it to --out): the outputs, `same_weights`, `matches_single`,
the decode server's prompt tokens by source before and after, and `transferred_tokens`. Exit 0
when the decode server's greedy output equals the single server's and tokens came by transfer, 1
otherwise (the JSON says which), 2 on bad arguments. Standard library only (urllib).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
import uuid
from typing import Any

SOURCE = "vllm:prompt_tokens_by_source_total"


def _post(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(
        url + "/v1/completions", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def _get_json(url: str, timeout: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def metrics(url: str, timeout: float = 10.0) -> dict[str, float]:
    """vllm:* counters of a server's /metrics (labels other than model/engine kept in the key)."""
    with urllib.request.urlopen(url + "/metrics", timeout=timeout) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:") or " " not in line:
            continue
        name, _, value = line.rpartition(" ")
        if "{" in name:
            base, _, labels = name.partition("{")
            keep = [x for x in labels.rstrip("}").split(",") if x and not x.startswith(("model_name=", "engine="))]
            name = base + ("{" + ",".join(keep) + "}" if keep else "")
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


def by_source(counters: dict[str, float]) -> dict[str, float]:
    prefix = SOURCE + '{source="'
    return {k[len(prefix) : -2]: v for k, v in counters.items() if k.startswith(prefix)}


def _request(model: str, prompt: list[int], max_tokens: int, params: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": False,
    }
    if params is not None:
        body["kv_transfer_params"] = params
    return body


def _text(resp: dict[str, Any]) -> str:
    return resp["choices"][0]["text"]


def transfer(args: argparse.Namespace) -> dict[str, Any]:
    p, d, t = args.prefill.rstrip("/"), args.decode.rstrip("/"), args.timeout
    prompt = args.prompt_ids
    probe = [(i * 7 + 3) % 1000 + 1 for i in range(len(prompt))]  # another prompt: no shared blocks
    out: dict[str, Any] = {"connector": args.connector, "prompt_tokens": len(prompt), "max_tokens": args.max_tokens}
    same_p = _text(_post(p, _request(args.model, probe, args.max_tokens, None), t))
    same_d = _text(_post(d, _request(args.model, probe, args.max_tokens, None), t))
    out["same_weights"] = same_p == same_d
    out["weights_probe"] = {"prefill": same_p, "decode": same_d}
    single = _text(_post(p, _request(args.model, prompt, args.max_tokens, None), t))
    before = by_source(metrics(d))
    if args.connector == "nixl":
        first = _post(p, _request(args.model, prompt, 1, {"do_remote_decode": True}), t)
        params = first.get("kv_transfer_params")
        if not params:
            raise RuntimeError(f"the prefill server returned no kv_transfer_params: {json.dumps(first)[:300]}")
        out["prefill_kv_transfer_params"] = params
        decode = _post(d, _request(args.model, prompt, args.max_tokens, params), t)
    else:
        bootstrap = args.bootstrap.rstrip("/")
        engines = _get_json(bootstrap + "/query", t)
        entry = engines.get("0") or next(iter(engines.values()))
        transfer_id = f"ctax-{uuid.uuid4().hex}"
        first = _post(p, _request(args.model, prompt, 1, {"do_remote_decode": True, "transfer_id": transfer_id}), t)
        params = {
            "do_remote_prefill": True,
            "transfer_id": transfer_id,
            "remote_engine_id": entry["engine_id"],
            "remote_bootstrap_addr": bootstrap,
        }
        out["decode_kv_transfer_params"] = params
        decode = _post(d, _request(args.model, prompt, args.max_tokens, params), t)
    after_counters = metrics(d)
    after = by_source(after_counters)
    out["prefill_first_token"] = _text(first)
    out["single"], out["decode"] = single, _text(decode)
    out["matches_single"] = out["decode"] == single
    out["decode_prompt_tokens_by_source"] = {"before": before, "after": after}
    out["transferred_tokens"] = after.get("external_kv_transfer", 0.0) - before.get("external_kv_transfer", 0.0)
    out["computed_tokens"] = after.get("local_compute", 0.0) - before.get("local_compute", 0.0)
    if args.connector == "nixl":
        # a histogram: its _sum series is the bytes (the _bucket series are cumulative counts)
        out["nixl_bytes_transferred"] = after_counters.get("vllm:nixl_bytes_transferred_sum", 0.0)
    out["ok"] = bool(out["same_weights"] and out["matches_single"] and out["transferred_tokens"] > 0)
    return out


def _ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--prompt-ids: {exc}") from None
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError("--prompt-ids: a comma-separated list of token ids")
    return ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pd_transfer.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--connector", required=True, choices=["nixl", "mooncake"])
    parser.add_argument("--prefill", required=True, help="the prefill (producer) server's URL")
    parser.add_argument("--decode", required=True, help="the decode (consumer) server's URL")
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--bootstrap", help="Mooncake: the prefill server's bootstrap URL (http://host:port)")
    parser.add_argument("--prompt-ids", type=_ids, default=[(i * 13 + 5) % 2000 + 1 for i in range(96)])
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.connector == "mooncake" and not args.bootstrap:
        parser.error("--bootstrap is needed for --connector mooncake")
    try:
        result = transfer(args)
    except (OSError, urllib.error.URLError, RuntimeError, KeyError, ValueError, StopIteration) as exc:
        result = {"connector": args.connector, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
    text = json.dumps(result, indent=1, sort_keys=True)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
