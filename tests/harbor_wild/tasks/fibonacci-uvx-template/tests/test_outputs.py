"""
Use this file to define pytest tests that verify the outputs of the task.

This file will be copied to /tests/test_outputs.py and run by the /tests/test.sh file
from the working directory.
"""

from pathlib import Path


def test_fib_file_exists():
    """The output file was written."""
    assert Path("/app/fib.txt").exists()


def test_fib_values():
    """The first 15 Fibonacci numbers, comma separated."""
    assert Path("/app/fib.txt").read_text() == "0,1,1,2,3,5,8,13,21,34,55,89,144,233,377\n"
