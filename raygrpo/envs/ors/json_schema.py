"""`transformers.utils.get_json_schema` for the functions `raygrpo.envs.ors.tools` builds, without transformers.

An ORS tool's schema is what TRL's integration shows the model: `get_json_schema` of a function whose signature and
Google-style docstring come from the tool. Importing transformers for it cost every env pool actor seconds in its
first rollout (transformers is no longer imported anywhere else in an actor). This module applies the same steps to
the same function: the docstring cut with transformers' own regular expressions (copied from
`transformers/utils/chat_template_utils.py`, Apache-2.0), parameters typed `str`, `int`, `float`, `bool`, `list`,
`dict`, required ones listed, `(choices: [...])` read as an enum, keys in the same order (the chat template renders
the schema with `tojson`, so the order is part of the prompt). `tests/test_ors_json_schema.py` compares both.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from typing import Any, get_type_hints

#: The JSON schema of each parameter type the ORS tools use (transformers' `_get_json_schema_type`).
BASIC_TYPES: dict[type, str] = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null",
                                list: "array", tuple: "array", dict: "object"}

# transformers' regular expressions for Google-style docstrings, unchanged.
_DESCRIPTION = re.compile(r"^(.*?)[\n\s]*(Args:|Returns:|Raises:|\Z)", re.DOTALL)
_ARGS = re.compile(r"\n\s*Args:\n(.*?)[\n\s]*(Returns:|Raises:|\Z)", re.DOTALL)
_ARGS_SPLIT = re.compile(
    r"""
(?:^|\n)  # Match the start of the args block, or a newline
([ \t]*)(\w+)(?:[ \t]*\([^()\n]*\))?:\s*  # Capture the indentation and the argument name, skip a "(type)"
(.*?)\s*  # Capture the argument description, which can span multiple lines, and strip trailing spacing
(?=\n(?!\1[ \t])[ \t]*\w+(?:[ \t]*\([^()\n]*\))?:|\Z)  # Stop at the next "name:" not indented deeper, or the end
""",
    re.DOTALL | re.VERBOSE,
)
_RETURNS = re.compile(r"\n\s*Returns:\n\s*(.*?)[\n\s]*(Raises:|\Z)", re.DOTALL)
_CHOICES = re.compile(r"\(choices:\s*(.*?)\)\s*$", re.IGNORECASE)


def parse_docstring(doc: str) -> tuple[str | None, dict[str, str], str | None]:
    """The description, each argument's description and the return's description of a Google-style docstring."""
    description = _DESCRIPTION.search(doc)
    args = _ARGS.search(doc)
    returns = _RETURNS.search(doc)
    params: dict[str, str] = {}
    if args is not None:
        block = "\n".join(line for line in args.group(1).split("\n") if line.strip())
        params = {m[1]: re.sub(r"\s*\n+\s*", " ", m[2].strip()) for m in _ARGS_SPLIT.findall(block)}
    return (description.group(1).strip() if description else None, params,
            returns.group(1).strip() if returns else None)


def _type_schema(hint: Any, func_name: str) -> dict[str, Any]:
    if hint not in BASIC_TYPES:
        raise TypeError(f"{func_name}: parameter type {hint!r} is not one of the ORS tools' basic types")
    return {"type": BASIC_TYPES[hint]}


def function_schema(func: Callable[..., Any]) -> dict[str, Any]:
    """The chat-template schema of `func`, as `transformers.utils.get_json_schema(func)` writes it.

    Raises:
        ValueError: `func` has no docstring, or an argument has no description in it.
        TypeError: A parameter is not typed with one of `BASIC_TYPES`.
    """
    name = getattr(func, "__name__", "operation")
    doc = inspect.getdoc(func)
    if not doc:
        raise ValueError(f"Cannot generate JSON schema for {name} because it has no docstring!")
    main_doc, descriptions, return_doc = parse_docstring(doc.strip())
    signature = inspect.signature(func)
    required = [p for p, param in signature.parameters.items() if param.default == inspect.Parameter.empty]
    properties: dict[str, dict[str, Any]] = {}
    returns: dict[str, Any] | None = None
    for param, hint in get_type_hints(func).items():
        if param == "return":
            returns = _type_schema(hint, name) if hint in BASIC_TYPES else None
        elif param in signature.parameters:
            properties[param] = _type_schema(hint, name)
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    if returns is not None and return_doc is not None:
        returns["description"] = return_doc
    for param, schema in properties.items():
        if param not in descriptions:
            raise ValueError(f"Cannot generate JSON schema for {name} because the docstring has no description for "
                             f"the argument '{param}'")
        desc = descriptions[param]
        choices = _CHOICES.search(desc)
        if choices:
            schema["enum"] = [c.strip() if isinstance(c, str) else c for c in json.loads(choices.group(1))]
            desc = choices.string[: choices.start()].strip()
        schema["description"] = desc
    output: dict[str, Any] = {"name": name, "description": main_doc, "parameters": parameters}
    if returns is not None:
        output["return"] = returns
    return {"type": "function", "function": output}
