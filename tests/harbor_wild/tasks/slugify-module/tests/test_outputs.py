import sys

sys.path.insert(0, "/app")

import pytest
from slugify import slugify  # the module the agent must write


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Hello, World!", "hello-world"),
        ("  Ray & GRPO 2.0 ", "ray-grpo-2-0"),
        ("already-a-slug", "already-a-slug"),
        ("---", ""),
        ("Ünïcode Títle", "n-code-t-tle"),
        ("MiXeD__case  words", "mixed-case-words"),
    ],
)
def test_slugify(text, expected):
    assert slugify(text) == expected
