"""What the model sees of an ORS environment: tool schemas and prompt messages, rendered as TRL renders them.

TRL's OpenReward integration (`trl.experimental.openreward`) turns each ORS tool into a Python method whose
signature comes from the tool's JSON schema (JSON types mapped to `str`, `int`, `float`, `bool`, `list`, `dict`;
required parameters first) and whose Google-style docstring is the tool's description followed by an `Args:` block
(each parameter's `description`, else its `title`, else its name); `transformers.utils.get_json_schema` then writes the
schema the chat template shows, tools in alphabetical order. raygrpo builds the same function shapes and writes the
same schema (`raygrpo.envs.ors.json_schema`: `get_json_schema` without importing transformers), so a model trained
here sees, token for token, the prompt it would see under TRL. Where TRL shows nothing, raygrpo shows what it can,
rendered the same way: a task's own tools (TRL lists the environment's shared tools only), and tools whose name or
parameter names Python does not allow (`submit-answer`, a parameter `from`), which TRL leaves out.

A conversation's rich blocks (reasoning, tool calls, tool results) become text as the SDK's own `flatten_messages`
writes them for a `get_prompt` reader (TRL's path); a tool's output with no text is `NO_OUTPUT`, as TRL has it.
"""

from __future__ import annotations

import dataclasses
import inspect
import keyword
import re
from typing import Any

from raygrpo.envs.ors.json_schema import function_schema

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_JSON_TO_PY: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list,
                                "object": dict}
_PY_OF_VALUE: tuple[type, ...] = (bool, int, float, str, list, dict)

#: What an image block becomes in text, when the spec asks for a placeholder.
IMAGE_PLACEHOLDER = "[image]"
#: A tool's output that has no text (an image only, no blocks at all), as TRL's integration words it.
NO_OUTPUT = "(no output)"
#: Block types that need no flattening (a turn's others, SDK 0.1.157's reasoning, tool_call and tool_result, do).
_PLAIN_BLOCKS = ("text", "image")


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


def tool_schema(name: str, description: str | None, input_schema: dict[str, Any] | None) -> dict[str, Any]:
    """The chat-template schema of one ORS tool, as TRL's integration presents it.

    TRL's tools are Python methods, so it leaves out a tool whose name or parameter is not a Python identifier (or is
    a keyword: a pydantic alias `from`). The chat template and the tool-call parser take any name, so such a tool is
    shown here all the same: the function is built with stand-ins for those parameter names, swapped back in the
    schema it gives.
    """
    schema = input_schema or {}
    properties: dict[str, dict[str, Any]] = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    ordered = [(n, p) for n, p in properties.items() if n in required] + \
              [(n, p) for n, p in properties.items() if n not in required]
    stand_ins = _python_names([pname for pname, _ in ordered])
    parameters, annotations, args_doc = [], {}, []
    for pname, pdef in ordered:
        arg, py_type = stand_ins[pname], _param_type(pdef)
        default = inspect.Parameter.empty if pname in required else pdef.get("default")
        parameters.append(inspect.Parameter(arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                                            annotation=py_type))
        annotations[arg] = py_type
        args_doc.append(f"        {arg}: {pdef.get('description') or pdef.get('title') or pname}")

    def tool(*args: Any, **kwargs: Any) -> str:
        """Only its shape is read (by `function_schema`): the tool runs on the ORS server."""
        raise TypeError(f"{name} runs on the ORS server; this function only describes it")

    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = (description or f"Call the {name} tool.") + (("\n\n    Args:\n" + "\n".join(args_doc))
                                                                if args_doc else "")
    tool.__signature__ = inspect.Signature(parameters, return_annotation=str)  # type: ignore[attr-defined]
    tool.__annotations__ = {**annotations, "return": str}
    # get_json_schema's result, without importing transformers in the actor
    return _with_names(function_schema(tool), {arg: pname for pname, arg in stand_ins.items()})


def _python_names(names: list[str]) -> dict[str, str]:
    """A Python parameter name for each of `names`: itself where Python allows it (TRL's rule, and not a keyword),
    else a stand-in `argN` that no other parameter is named."""
    taken = set(names)
    out: dict[str, str] = {}
    for position, pname in enumerate(names):
        if _IDENTIFIER.match(pname) and not keyword.iskeyword(pname):
            out[pname] = pname
            continue
        arg = f"arg{position}"
        while arg in taken:
            arg += "_"
        taken.add(arg)
        out[pname] = arg
    return out


def _with_names(rendered: dict[str, Any], real: dict[str, str]) -> dict[str, Any]:
    """`rendered` (a function schema) with each parameter's stand-in name swapped for its real one, order kept."""
    if all(arg == pname for arg, pname in real.items()):
        return rendered
    parameters = rendered["function"]["parameters"]
    parameters["properties"] = {real[arg]: p for arg, p in parameters["properties"].items()}
    if "required" in parameters:
        parameters["required"] = [real[arg] for arg in parameters["required"]]
    return rendered


def tool_schemas(specs: list[Any]) -> list[dict[str, Any]]:
    """Schemas of the SDK's `ToolSpec`s (or dicts with `name`, `description`, `input_schema`), alphabetical."""
    out = []
    for spec in specs:
        if isinstance(spec, dict):
            name, description, schema = spec["name"], spec.get("description"), spec.get("input_schema")
        else:
            name, description, schema = spec.name, spec.description, spec.input_schema
        out.append(tool_schema(name, description, schema))
    return sorted(out, key=lambda t: t["function"]["name"])


def blocks_text(blocks: Any, images: str = "drop") -> str:
    """Text of the SDK's text and image blocks, joined by newlines; an image block is left out (`images="drop"`, as
    TRL does) or becomes `IMAGE_PLACEHOLDER`."""
    parts: list[str] = []
    for block in blocks or []:
        kind = _kind(block)
        if kind == "text":
            text = block.get("text") if isinstance(block, dict) else block.text
            if text:
                parts.append(str(text))
        elif kind == "image" and images == "placeholder":
            parts.append(IMAGE_PLACEHOLDER)
    return "\n".join(parts)


def tool_output_text(blocks: Any, images: str = "drop") -> str:
    """What the model reads of a tool's output: `blocks_text`, or `NO_OUTPUT` when that is empty (an output of
    images only, or of nothing), as TRL's integration has it, so that no tool message is blank."""
    return blocks_text(blocks, images) or NO_OUTPUT


def chat_messages(messages: list[Any], images: str = "drop") -> list[dict[str, str]]:
    """The SDK's prompt `Message`s as chat messages, roles kept (a `get_prompt` environment gives one user message);
    a turn's reasoning, tool calls and tool results as text (`flattened`)."""
    return [{"role": m.role, "content": blocks_text(flattened(m), images)} for m in messages]


def flattened(message: Any) -> list[Any]:
    """The text and image blocks of one conversation turn: its rich blocks rendered by the SDK's own
    `flatten_messages`, as a `get_prompt` reader (TRL) receives them: reasoning as `<think>...</think>`, a tool call
    as `[tool_call NAME] {arguments}`, a tool result as `[tool_result]` (or `[tool_result (error)]`) followed by its
    blocks."""
    if all(_kind(block) in _PLAIN_BLOCKS for block in message.blocks):
        return list(message.blocks)
    from openreward.environments import Message
    from openreward.environments.utils import flatten_messages

    turn = Message(role=message.role, blocks=[_as_dict(block) for block in message.blocks])
    return list(flatten_messages([turn])[1:])  # without the "[role]" header it opens each turn of a conversation with


def _kind(block: Any) -> str | None:
    return block.get("type") if isinstance(block, dict) else getattr(block, "type", None)


def _as_dict(block: Any) -> Any:
    """A block of the SDK's client (a dataclass) as the plain dict its server-side model validates."""
    return dataclasses.asdict(block) if dataclasses.is_dataclass(block) else block
