"""Write a tiny Llama-architecture model directory that `vllm serve --load-format dummy` serves.

    python tools/tiny_model.py OUT_DIR [--vocab 4096] [--layers 2] [--hidden 128] [--force]

No model hub is reachable from the study's CPU machines, and the study needs a real engine,
not real answers: vLLM fills the weights with random values (`--load-format dummy`), while
the scheduler, the KV cache, the connectors and the HTTP server are vLLM's own. So the
directory holds only what vLLM reads without weights:

* config.json — LlamaForCausalLM, 2 layers, hidden size 128, 2 heads of 64 (1 KV head), a
  vocabulary of 98304, float32, 4096 positions;
* tokenizer.json, tokenizer_config.json, special_tokens_map.json — a byte-level BPE tokenizer
  of 4096 ids trained here with the `tokenizers` library on a built-in text, its vocabulary
  padded with plain entries `<tN>` up to the model's (deterministic: same arguments, same
  files; entries of the BPE model itself, not added tokens, which make loading slow).
  The vocabulary is that large because the load generator's token-id prompts use ids up to
  ~95.5k (connector_tax.loadgen.worker.prompts: 1000-30000 plus request-unique ids above), and vLLM
  rejects ids beyond the model's and the tokenizer's vocabulary; every id, prompted or
  generated, decodes to text;
* a chat template (ChatML, in tokenizer_config.json), so `/v1/chat/completions` and `/tokenize`
  with messages serve: without one vLLM refuses every chat request;
* generation_config.json — no sampling defaults of its own;
* connector_tax_tiny_model.json — what made it (for the manifest).

Runs under any Python with `tokenizers` (the vLLM CPU environment has it). Bad arguments: one
line on stderr, exit 2. Imports nothing from connector_tax.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MARKER = "connector_tax_tiny_model.json"
SPECIAL = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2: unk, bos, eos
# ChatML, as Qwen's templates write it (and the simulator renders chat: sim/tokens.py), ending in
# the assistant's turn when asked for the generation prompt. Plain text, not special tokens: the
# tokenizer splits the markers into ordinary tokens, which a chat prompt's length counts.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def corpus() -> list[str]:
    """A deterministic training text: enough distinct words and byte pairs for a few thousand
    merges. Its content does not matter; the weights are random anyway."""
    words = (
        "the of and to in is was for on that with as by at from it an be this are or which "
        "kv cache connector engine step schedule token prefill decode request rate latency "
        "block layer worker model server metric throughput saturation reference phase shape "
        "mooncake nixl lmcache noop multi producer consumer both plain tax framework"
    ).split()
    lines = []
    for i in range(4000):
        a, b, c = words[i % len(words)], words[(i * 7 + 3) % len(words)], words[(i * 13 + 5) % len(words)]
        lines.append(f"{a} {b} {c} {i} {i * 31 % 9973} {a}{b} {c.upper()} {b[::-1]}.")
    return lines


def model_config(vocab: int, layers: int, hidden: int) -> dict:
    heads = max(1, hidden // 64)  # head size 64: one vLLM's CPU attention supports
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": hidden * 2,
        "num_attention_heads": heads,
        "num_key_value_heads": max(1, heads // 2),
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


BPE_VOCAB = 4096  # trained ids; the rest of the vocabulary are added tokens


def train_tokenizer(vocab: int):  # noqa: ANN201 - tokenizers.Tokenizer, imported lazily
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab, BPE_VOCAB),
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    data = json.loads(tokenizer.to_str())
    table = data["model"]["vocab"]
    for i in range(len(table), vocab):  # ASCII: the byte-level decoder maps it to itself
        table[f"<t{i}>"] = i
    return Tokenizer.from_str(json.dumps(data))


def write_model(out: Path, vocab: int = 4096, layers: int = 2, hidden: int = 128) -> dict:
    """Write the model directory; returns what the marker file records."""
    tokenizer = train_tokenizer(vocab)
    # The trainer stops when no pair is left to merge; the model's vocabulary must cover every
    # id the tokenizer can produce, and vLLM rejects prompt ids >= vocab_size, so the config
    # keeps the requested size (ids above the tokenizer's are valid token-id prompts).
    if tokenizer.get_vocab_size() > vocab:
        raise ValueError(f"--vocab: tokenizer has {tokenizer.get_vocab_size()} ids, more than {vocab}")
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    files = {
        "config.json": model_config(vocab, layers, hidden),
        "generation_config.json": {"bos_token_id": 1, "eos_token_id": 2},
        "special_tokens_map.json": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "add_bos_token": False,
            "model_max_length": 4096,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        },
    }
    for name, data in files.items():
        (out / name).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    marker = {
        "made_by": "connector-tax tools/tiny_model.py",
        "weights": "none: serve with --load-format dummy (random weights)",
        "vocab_size": vocab,
        "tokenizer_vocab_size": tokenizer.get_vocab_size(),
        "num_hidden_layers": layers,
        "hidden_size": hidden,
    }
    (out / MARKER).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
    return marker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/tiny_model.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", metavar="OUT_DIR", help="folder to write (created)")
    parser.add_argument("--vocab", type=int, default=98304, help="vocabulary size (default 98304)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    parser.add_argument("--hidden", type=int, default=128, help="hidden size, a multiple of 64 (default 128)")
    parser.add_argument("--force", action="store_true", help="overwrite a folder that is not a tiny model")
    args = parser.parse_args(argv)
    prog = "tiny_model.py"
    if not 512 <= args.vocab <= 262144:
        print(f"{prog}: --vocab: {args.vocab} is out of range 512-262144", file=sys.stderr)
        return 2
    if not 1 <= args.layers <= 64:
        print(f"{prog}: --layers: {args.layers} is out of range 1-64", file=sys.stderr)
        return 2
    if args.hidden < 64 or args.hidden % 64:
        print(f"{prog}: --hidden: {args.hidden} is not a multiple of 64 (>= 64)", file=sys.stderr)
        return 2
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"{prog}: OUT_DIR: {out} exists and is not a folder", file=sys.stderr)
        return 2
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).exists() and not args.force:
        print(f"{prog}: OUT_DIR: {out} is not empty and holds no tiny model (--force overwrites)", file=sys.stderr)
        return 2
    try:
        marker = write_model(out, args.vocab, args.layers, args.hidden)
    except ImportError as exc:
        print(
            f"{prog}: needs the tokenizers package ({exc}); run it with the vLLM environment's python", file=sys.stderr
        )
        return 2
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"model_dir": str(out.resolve()), **marker}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
