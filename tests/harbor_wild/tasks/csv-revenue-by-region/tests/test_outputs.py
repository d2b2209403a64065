import hashlib
import json
from pathlib import Path

import pytest

OUT = Path("/app/revenue.json")
EXPECTED = {"east": 55.25, "north": 204.9, "south": 798.4, "west": 232.0}


def test_output_exists():
    assert OUT.exists(), "revenue.json was not written"


def test_regions_and_totals():
    data = json.loads(OUT.read_text())
    assert set(data) == set(EXPECTED)
    for region, total in EXPECTED.items():
        assert data[region] == pytest.approx(total, abs=0.005), region


def test_input_untouched():
    digest = hashlib.sha256(Path("/app/sales.csv").read_bytes()).hexdigest()
    assert digest == "d096b00e6edcc12e4052b0085f490f16536e96d9a4ceff6de152e42b0983b11c"
