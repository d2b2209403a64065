"""Parsing model text into tool calls: good calls, and every way a call can be broken."""

import pytest

from raygrpo.agent.toolcalls import ToolCallProblem, format_tool_call, parse_tool_calls
from raygrpo.core.types import ToolCall

pytestmark = pytest.mark.timeout(30)


def test_round_trip_of_formatted_calls():
    text = "Let me try.\n" + format_tool_call("echo", {"text": "héllo\n\"x\""}) + format_tool_call("add", {"a": 1})
    content, calls = parse_tool_calls(text)
    assert content == "Let me try."
    assert calls == [ToolCall("echo", {"text": 'héllo\n"x"'}), ToolCall("add", {"a": 1})]


def test_plain_text_has_no_calls():
    assert parse_tool_calls("The answer is 4.") == ("The answer is 4.", [])


@pytest.mark.parametrize(
    "body, fragment",
    [
        ('{"name": "echo", "arguments": {"text": "a"', "not valid JSON"),
        ('["echo"]', "must be a JSON object"),
        ('{"arguments": {}}', 'no "name"'),
        ('{"name": "echo", "arguments": [1, 2]}', "must be a JSON object"),
        ('{"name": "echo", "arguments": "not json"}', "are not a JSON object"),
    ],
)
def test_broken_calls_become_problems(body, fragment):
    _, calls = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert len(calls) == 1 and isinstance(calls[0], ToolCallProblem)
    assert fragment in calls[0].message


def test_unclosed_last_call_is_parsed_to_the_end():
    _, calls = parse_tool_calls('<tool_call>{"name": "echo", "arguments": {"text": "x"}}')
    assert calls == [ToolCall("echo", {"text": "x"})]


def test_arguments_given_as_json_string():
    _, calls = parse_tool_calls('<tool_call>{"name": "echo", "arguments": "{\\"text\\": \\"x\\"}"}</tool_call>')
    assert calls == [ToolCall("echo", {"text": "x"})]
