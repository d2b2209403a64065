"""`raygrpo.envs.ors.json_schema.function_schema` writes what `transformers.utils.get_json_schema` writes for the
functions `raygrpo.envs.ors.tools.tool_schema` builds from ORS tools, key order included (the chat template renders
the schema with `tojson`)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.timeout(120)

SCHEMAS = [
    ("noargs", "Take no arguments.", None),
    ("nodesc", None, {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}),
    ("mixed", "Several kinds.\n\nSecond paragraph with Args: inside and Returns: too.", {
        "type": "object", "required": ["b", "s"],
        "properties": {
            "s": {"type": "string", "description": "A string\nover two lines."},
            "n": {"type": "number", "title": "A number", "default": 1.5},
            "b": {"type": "boolean", "description": "Flag (choices: [true, false])"},
            "l": {"type": "array", "items": {"type": "integer"}},
            "o": {"type": "object", "default": {"k": 1}},
            "u": {"anyOf": [{"type": "null"}, {"type": "integer"}], "description": "Maybe an int."},
            "c": {"type": "string", "description": "Pick one (choices: [\"a\", \" b \", \"c\"])"},
            "d": {"default": 3},
        },
    }),
    ("unicode", "Écho — “quoted” 🙂", {"type": "object", "properties": {
        "text": {"type": "string", "description": "naïve café: with a colon"}}, "required": ["text"]}),
]


def _functions():
    """The functions `tool_schema` hands to the schema writer, captured."""
    from raygrpo.envs.ors import tools

    captured = []
    real = tools.function_schema
    tools.function_schema = lambda f: captured.append(f) or real(f)
    try:
        for name, description, schema in SCHEMAS:
            assert tools.tool_schema(name, description, schema) is not None
    finally:
        tools.function_schema = real
    return captured


def test_schemas_equal_transformers_key_order_included():
    from transformers.utils import get_json_schema

    from raygrpo.envs.ors.json_schema import function_schema

    for func in _functions():
        mine, theirs = function_schema(func), get_json_schema(func)
        assert json.dumps(mine) == json.dumps(theirs), func.__name__


def test_missing_descriptions_and_unknown_types_are_refused():
    from raygrpo.envs.ors.json_schema import function_schema

    def undocumented(x: int) -> str:
        return ""

    with pytest.raises(ValueError, match="no docstring"):
        function_schema(undocumented)

    def odd(x: complex) -> str:
        """Odd.

        Args:
            x: A complex number.
        """
        return ""

    with pytest.raises(TypeError, match="basic types"):
        function_schema(odd)


def test_a_parameter_named_with_a_keyword_or_no_identifier_is_kept():
    """JSON has no identifier rule: `from` (a pydantic alias) and `file-path` are shown as they are, typed and
    described as any other parameter (a stand-in `arg0` is not confused with a parameter of that name)."""
    from raygrpo.envs.ors.tools import tool_schema

    schema = {"type": "object", "required": ["from", "to"], "properties": {
        "from": {"type": "string", "description": "Where from."},
        "file-path": {"type": "string", "title": "A path"},
        "to": {"type": "integer", "description": "Where to."},
        "arg0": {"type": "boolean", "default": False},
    }}
    parameters = tool_schema("move", "Move a file.", schema)["function"]["parameters"]
    assert json.dumps(parameters) == json.dumps({"type": "object", "properties": {
        "from": {"type": "string", "description": "Where from."},
        "to": {"type": "integer", "description": "Where to."},
        "file-path": {"type": "string", "description": "A path"},
        "arg0": {"type": "boolean", "description": "arg0"},
    }, "required": ["from", "to"]})


def test_a_tool_named_outside_python_identifiers_is_kept():
    """`submit-answer`, `files.read`: the chat template and the tool-call parser take any name; TRL leaves the tool
    out (its tools are Python methods), so the model could never call it."""
    from raygrpo.envs.ors.tools import tool_schema, tool_schemas

    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    dashed = tool_schema("submit-answer", "Submit.", schema)["function"]
    assert dashed == {**tool_schema("submit_answer", "Submit.", schema)["function"], "name": "submit-answer"}
    names = [t["function"]["name"] for t in tool_schemas([{"name": n, "description": "D.", "input_schema": None}
                                                          for n in ("files.read", "submit-answer", "echo")])]
    assert names == ["echo", "files.read", "submit-answer"]
