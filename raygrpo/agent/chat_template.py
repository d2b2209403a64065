"""A model folder's tokenizer and chat template without importing transformers: what an env pool actor loads.

An env pool actor needs a tokenizer only to encode and decode text and to render the chat template. Loading it with
`transformers.AutoTokenizer` costs the import of transformers and, through `AutoConfig`, of torch (13 s on a loaded
2-core machine, against 0.2 s for `tokenizers` and `jinja2`), on every actor start: an elastic pool answered bursts
seconds late. `ChatTokenizer` is the same backend tokenizer (`tokenizers.Tokenizer` from `tokenizer.json`) with the
chat template rendered in the Jinja environment transformers sets up (`transformers.utils.chat_template_utils`:
sandboxed, `trim_blocks`/`lstrip_blocks`, `raise_exception`, `tojson` without HTML escaping, `strftime_now`, `dict`,
a guarded `namespace`, `{% generation %}`), so its ids and text are those of `AutoTokenizer` for the same folder
(`tests/test_chat_template.py` compares both).

`load_tokenizer` takes this path only for folders that transformers itself would load as a plain `TokenizersBackend`
from `tokenizer.json` with nothing added on load (what `save_pretrained` writes for raygrpo's tiny model, converted
GGUF models and SmolLM2); any other folder (a model-specific tokenizer class, remote code, legacy
`special_tokens_map.json`, special tokens missing from `tokenizer.json`, ...) is loaded with `AutoTokenizer` as before.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import logging
import re
import sys
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: `tokenizer_config.json` classes that transformers loads from `tokenizer.json` as they are.
PLAIN_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
#: Named special tokens, in transformers' order (`PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES`).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
#: Files whose presence makes transformers change the tokenizer on load (legacy formats): such folders use it.
LEGACY_FILES = ("special_tokens_map.json", "added_tokens.json")
#: Names a message's reasoning is passed under; the first is the one chat templates read (as transformers aliases them).
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # a serialized AddedToken
        value = value.get("content")
    return value if isinstance(value, str) else None


@lru_cache(maxsize=1)
def _types_with_other_tokenizer() -> frozenset[str] | None:
    """Model types for which `AutoTokenizer` ignores a `TokenizersBackend` class in `tokenizer_config.json` and loads
    the model's own tokenizer class: `MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS`, read from the installed transformers'
    source without importing it. None when it cannot be read (every folder then loads with transformers)."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(next(iter(spec.submodule_search_locations))) / "models" / "auto" / "tokenization_auto.py"
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS" for t in targets):
                try:
                    return frozenset(ast.literal_eval(node.value))
                except ValueError:
                    return None
    return None


def plain_folder_issue(folder: Path) -> str | None:
    """Why transformers would load `folder`'s tokenizer otherwise than as `tokenizer.json` as it is (None: it would
    not, and `ChatTokenizer.from_folder` gives the same tokenizer)."""
    if not (folder / "tokenizer.json").is_file() or not (folder / "tokenizer_config.json").is_file():
        return "no tokenizer.json with a tokenizer_config.json"
    if any((folder / name).exists() for name in LEGACY_FILES):
        return f"a legacy file ({', '.join(LEGACY_FILES)})"
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    if config.get("tokenizer_class") not in PLAIN_CLASSES:
        return f"tokenizer_class {config.get('tokenizer_class')!r}"
    for key in ("auto_map", "fast_tokenizer_files", "fix_mistral_regex", "split_special_tokens", "add_prefix_space"):
        if config.get(key):
            return f"tokenizer_config.json sets {key}"
    if (folder / "config.json").is_file():
        model_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
        others = _types_with_other_tokenizer()
        if others is None or model_type in others:
            return f"model_type {model_type!r} may have a tokenizer class of its own"
    extra = config.get("extra_special_tokens", config.get("additional_special_tokens")) or []
    if not isinstance(extra, list):
        return "named extra special tokens"
    named = {k for k, v in config.items() if k.endswith("_token") and _token_text(v) is not None}
    if named - set(SPECIAL_TOKEN_NAMES):
        return f"model-specific special tokens {sorted(named - set(SPECIAL_TOKEN_NAMES))}"
    backend = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    added = {t["content"]: t for t in backend.get("added_tokens", [])}
    for token in [_token_text(config.get(k)) for k in SPECIAL_TOKEN_NAMES] + [_token_text(t) for t in extra]:
        if token is not None and not added.get(token, {}).get("special"):
            return f"special token {token!r} is not a special added token of tokenizer.json"
    for index, token in (config.get("added_tokens_decoder") or {}).items():
        known = added.get(token.get("content"))
        if known is None or known["id"] != int(index) or known["special"] != token.get("special", known["special"]):
            return f"added token {token.get('content')!r} differs from tokenizer.json"
    model = backend.get("model") or {}
    if config.get("clean_up_tokenization_spaces") and (
        model.get("type") != "BPE" or config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output")
    ):
        return "clean_up_tokenization_spaces"
    return None


def chat_templates_of(folder: Path, config: dict[str, Any]) -> str | dict[str, str] | None:
    """The folder's chat template as transformers reads it: `chat_template.jinja` and
    `additional_chat_templates/*.jinja` (a dict by name when there are several) before `tokenizer_config.json`'s."""
    templates: dict[str, str] = {}
    if (folder / "chat_template.jinja").is_file():
        templates["default"] = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    extra_dir = folder / "additional_chat_templates"
    if extra_dir.is_dir():
        for path in extra_dir.glob("*.jinja"):
            templates[path.name.removesuffix(".jinja")] = path.read_text(encoding="utf-8")
    if list(templates) == ["default"]:
        return templates["default"]
    if templates:
        return templates
    template = config.get("chat_template")
    if isinstance(template, list | tuple):
        return {t["name"]: t["template"] for t in template}
    return template


@lru_cache
def compile_template(source: str) -> Any:
    """`source` compiled in the Jinja environment of transformers' `_cached_compile_jinja_template`."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    if tuple(int(x) for x in re.findall(r"\d+", jinja2.__version__)[:3]) < (3, 1, 6):
        raise ImportError(f"chat templates need jinja2>=3.1.6 (older ones have sandbox escapes), found {jinja2.__version__}")

    class Generation(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` renders its body (transformers uses it to mark assistant tokens)."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's own signature trick: `namespace(self=...)` works
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                    "Please rename the attribute."
                )

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(source)


def _as_dicts(value: Any) -> Any:
    """Message objects (dataclasses, pydantic models) as dicts, as transformers normalizes a conversation."""
    if isinstance(value, Mapping):
        return {k: _as_dicts(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_dicts(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_as_dicts(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _as_dicts(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _as_dicts(value.model_dump())
    return value


def plain_data(value: Any) -> Any:
    """What the template sees of `value`: plain JSON types only, anything else an inert `<TypeName>` placeholder
    (transformers' `_plain_template_data`: the sandbox does not know which methods of rich objects are dangerous)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_data(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_data(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain_data(v) for v in value)
    numpy = sys.modules.get("numpy")  # a numpy scalar can only exist once numpy is imported
    if numpy is not None and isinstance(value, numpy.generic):
        return plain_data(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return plain_data(value.model_dump())
    return f"<{type(value).__name__}>"


def _with_reasoning_aliases(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for message in messages:
        reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


class ChatTokenizer:
    """A `tokenizers.Tokenizer` with the chat template and special tokens of its model folder: the part of a
    transformers tokenizer the agent loop uses (`encode`, `decode`, `apply_chat_template` of one conversation,
    `get_vocab`), giving the same ids and text.

    Args:
        backend: The tokenizer from the folder's `tokenizer.json`.
        special_tokens: Named special tokens (`eos_token`, ...) to their text; the template sees them by name.
        chat_template: The chat template, or templates by name (`"default"`, `"tool_use"`, ...).
        name_or_path: The folder it was loaded from.
    """

    def __init__(self, backend: Any, special_tokens: dict[str, str], chat_template: str | dict[str, str] | None,
                 name_or_path: str = "") -> None:
        backend.no_truncation()  # transformers encodes without truncation or padding unless asked for them
        backend.no_padding()
        self.backend = backend
        self.special_tokens_map = dict(special_tokens)
        self.chat_template = chat_template
        self.name_or_path = name_or_path
        self.eos_token: str | None = special_tokens.get("eos_token")
        self.eos_token_id: int | None = self.convert_tokens_to_ids(self.eos_token) if self.eos_token else None

    @classmethod
    def from_folder(cls, folder: str | Path) -> ChatTokenizer:
        """The tokenizer of a model folder that `plain_folder_issue` accepts."""
        from tokenizers import Tokenizer

        folder = Path(folder)
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        special = {k: t for k in SPECIAL_TOKEN_NAMES if (t := _token_text(config.get(k))) is not None}
        return cls(Tokenizer.from_file(str(folder / "tokenizer.json")), special, chat_templates_of(folder, config),
                   name_or_path=str(folder))

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | None | list[int | None]:
        if isinstance(tokens, str):
            return self.backend.token_to_id(tokens)
        return [self.backend.token_to_id(t) for t in tokens]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def get_chat_template(self, chat_template: str | None = None, tools: list[dict] | None = None) -> str:
        """The template to render with, chosen as transformers does: the argument (or its name among several
        templates), else `tool_use` when there are tools and such a template, else the default one."""
        templates = self.chat_template
        if isinstance(templates, dict):
            if chat_template is not None and chat_template in templates:
                return templates[chat_template]
            if chat_template is None:
                if tools is not None and "tool_use" in templates:
                    return templates["tool_use"]
                if "default" in templates:
                    return templates["default"]
                raise ValueError(f"the tokenizer has several chat templates and no default: {sorted(templates)}")
        if chat_template is None:
            if templates is None:
                raise ValueError("the tokenizer has no chat template and none was passed")
            chat_template = templates
        return chat_template

    def render(self, conversation: list[Any], tools: list[dict] | None = None, chat_template: str | None = None,
               add_generation_prompt: bool = False, **kwargs: Any) -> str:
        """The chat template's text for one conversation (`apply_chat_template(..., tokenize=False)`)."""
        template = self.get_chat_template(chat_template, tools)
        if not conversation:
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        messages = []
        for message in _as_dicts(conversation):
            if not isinstance(message, dict):
                raise TypeError(f"Chat messages should be dicts, dataclasses or pydantic models, but got {message!r}.")
            messages.append({k: v for k, v in message.items() if v is not None})
        if tools is not None and not all(isinstance(t, dict) for t in tools):
            raise ValueError("tools must be JSON schemas (dicts) here; transformers' function-to-schema is not used")
        return compile_template(template).render(
            messages=_with_reasoning_aliases(plain_data(messages)),
            tools=plain_data(tools),
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **plain_data({**self.special_tokens_map, **kwargs}),
        )

    def apply_chat_template(self, conversation: list[Any], tools: list[dict] | None = None,
                            chat_template: str | None = None, add_generation_prompt: bool = False,
                            tokenize: bool = True, return_dict: bool = True, **kwargs: Any) -> Any:
        """Render one conversation and, with `tokenize`, encode it without adding special tokens: the ids (or
        `{"input_ids": ..., "attention_mask": ...}` with `return_dict`), as transformers' method of that name."""
        text = self.render(conversation, tools=tools, chat_template=chat_template,
                           add_generation_prompt=add_generation_prompt, **kwargs)
        if not tokenize:
            return text
        ids = self.encode(text, add_special_tokens=False)
        return {"input_ids": ids, "attention_mask": [1] * len(ids)} if return_dict else ids


def load_tokenizer(model_dir: str) -> Any:
    """The tokenizer of a model folder: a `ChatTokenizer` where transformers would load `tokenizer.json` as it is,
    else `transformers.AutoTokenizer`'s (which imports transformers and torch)."""
    issue = plain_folder_issue(Path(model_dir))
    if issue is None:
        return ChatTokenizer.from_folder(model_dir)
    logger.info("Loading the tokenizer of %s with transformers: %s", model_dir, issue)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
