"""What the model sees of an ORS environment: tool schemas and prompt messages, rendered as TRL renders them.

TRL's OpenReward integration (`trl.experimental.openreward`) turns each ORS tool into a Python method whose
signature comes from the tool's JSON schema (JSON types mapped to `str`, `int`, `float`, `bool`, `list`, `dict`;
required parameters first) and whose Google-style docstring is the tool's description followed by an `Args:` block
(each parameter's `description`, else its `title`, else its name); `transformers.utils.get_json_schema` then writes the
schema the chat template shows, tools in alphabetical order. raygrpo builds the same function shapes and writes the
same schema (`raygrpo.envs.ors.json_schema`: `get_json_schema` without importing transformers), so a model trained
here sees, token for token, the prompt it would see under TRL. (TRL lists the environment's shared tools only; raygrpo
also shows a task's own tools, rendered the same way.)
"""

from __future__ import annotations

import inspect
import logging
import re
from typing import Any

from raygrpo.envs.ors.json_schema import function_schema

logger = logging.getLogger(__name__)

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_JSON_TO_PY: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list,
                                "object": dict}
_PY_OF_VALUE: tuple[type, ...] = (bool, int, float, str, list, dict)

#: What an image block becomes in text, when the spec asks for a placeholder.
IMAGE_PLACEHOLDER = "[image]"


def _param_type(pdef: dict[str, Any]) -> type:
    """The Python type TRL gives one JSON-schema property: its `type`, the non-null member of an `anyOf`/`oneOf`,
    the type of its default, else `str`."""
    kind = pdef.get("type")
    if isinstance(kind, str) and kind in _JSON_TO_PY:
        return _JSON_TO_PY[kind]
    for key in ("anyOf", "oneOf"):
        for option in pdef.get(key) or []:
            inner = option.get("type") if isinstance(option, dict) else None
            if isinstance(inner, str) and inner in _JSON_TO_PY:
                return _JSON_TO_PY[inner]
    default = pdef.get("default")
    if default is not None:
        for py_type in _PY_OF_VALUE:
            if isinstance(default, py_type):
                return py_type
    return str


def tool_schema(name: str, description: str | None, input_schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """The chat-template schema of one ORS tool, as TRL's integration presents it; None for a tool TRL cannot
    present (a name or parameter that is not a Python identifier), which is left out with a warning."""
    if not _IDENTIFIER.match(name):
        logger.warning("ORS tool %r is left out: its name is not an identifier", name)
        return None
    schema = input_schema or {}
    properties: dict[str, dict[str, Any]] = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    ordered = [(n, p) for n, p in properties.items() if n in required] + \
              [(n, p) for n, p in properties.items() if n not in required]
    parameters, annotations, args_doc = [], {}, []
    for pname, pdef in ordered:
        if not _IDENTIFIER.match(pname):
            logger.warning("ORS tool %r is left out: its parameter %r is not an identifier", name, pname)
            return None
        py_type = _param_type(pdef)
        default = inspect.Parameter.empty if pname in required else pdef.get("default")
        parameters.append(inspect.Parameter(pname, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                                            annotation=py_type))
        annotations[pname] = py_type
        args_doc.append(f"        {pname}: {pdef.get('description') or pdef.get('title') or pname}")

    def tool(*args: Any, **kwargs: Any) -> str:
        """Only its shape is read (by `function_schema`): the tool runs on the ORS server."""
        raise TypeError(f"{name} runs on the ORS server; this function only describes it")

    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = (description or f"Call the {name} tool.") + (("\n\n    Args:\n" + "\n".join(args_doc))
                                                                if args_doc else "")
    tool.__signature__ = inspect.Signature(parameters, return_annotation=str)  # type: ignore[attr-defined]
    tool.__annotations__ = {**annotations, "return": str}
    return function_schema(tool)  # get_json_schema's result, without importing transformers in the actor


def tool_schemas(specs: list[Any]) -> list[dict[str, Any]]:
    """Schemas of the SDK's `ToolSpec`s (or dicts with `name`, `description`, `input_schema`), alphabetical."""
    out = []
    for spec in specs:
        if isinstance(spec, dict):
            name, description, schema = spec["name"], spec.get("description"), spec.get("input_schema")
        else:
            name, description, schema = spec.name, spec.description, spec.input_schema
        rendered = tool_schema(name, description, schema)
        if rendered is not None:
            out.append(rendered)
    return sorted(out, key=lambda t: t["function"]["name"])


def blocks_text(blocks: Any, images: str = "drop") -> str:
    """Text of the SDK's content blocks, joined by newlines; an image block is left out (`images="drop"`, as TRL
    does) or becomes `IMAGE_PLACEHOLDER`."""
    parts: list[str] = []
    for block in blocks or []:
        kind = block.get("type") if isinstance(block, dict) else getattr(block, "type", None)
        if kind == "text":
            text = block.get("text") if isinstance(block, dict) else block.text
            if text:
                parts.append(str(text))
        elif kind == "image" and images == "placeholder":
            parts.append(IMAGE_PLACEHOLDER)
    return "\n".join(parts)


def chat_messages(messages: list[Any], images: str = "drop") -> list[dict[str, str]]:
    """The SDK's prompt `Message`s as chat messages, roles kept (a `get_prompt` environment gives one user message)."""
    return [{"role": m.role, "content": blocks_text(m.blocks, images)} for m in messages]
