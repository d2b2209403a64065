"""
Use this file to define pytest tests that verify the outputs of the task.

This file will be copied to /tests/test_outputs.py and run by the /tests/test.sh file
from the working directory.
"""

from pathlib import Path

PRIMES = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71]


def test_primes_file_exists():
    """The output file exists."""
    assert Path("/app/primes.txt").exists()


def test_primes():
    """The first 20 primes, one per line."""
    lines = Path("/app/primes.txt").read_text().split()
    assert [int(x) for x in lines] == PRIMES
