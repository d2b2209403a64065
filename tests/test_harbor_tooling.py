"""Reading what a task's `tests/test.sh` needs (`raygrpo.envs.harbor_tooling`), on scripts in the shapes task authors
write: Harbor's own `harbor tasks init` template, pytest with `--ctrf`, `python -m pytest`, here-documents, command
substitutions, installs."""

from __future__ import annotations

import pytest

from raygrpo.envs.harbor_tooling import probe_command, read_probe, scan_test_script

pytestmark = pytest.mark.timeout(30)


def test_harbors_own_template_downloads_its_tooling(tmp_path):
    from harbor.cli.tasks import init

    init(name="acme/tmpl", tasks_dir=tmp_path, verifier_mode="shared")
    needs = scan_test_script((tmp_path / "tmpl" / "tests" / "test.sh").read_text())
    assert needs.installs == ["curl", "uv", "uvx"]  # apt-get install curl; the uv installer
    assert "uvx" not in needs.commands and "curl" not in needs.commands and "apt-get" in needs.commands
    assert needs.via_uvx and needs.packages == ["pytest==8.4.1", "pytest-json-ctrf==0.3.5"]
    assert needs.urls == ["https://astral.sh/uv/0.9.7/install.sh"]
    # Offline tooling serves the installers and uvx: the packages are then looked for in the sandbox's python3.
    offline = probe_command(needs, served=("apt-get", "curl", "uv", "uvx"), check_urls=False)
    assert "astral.sh" not in offline and "pytest==8.4.1 pytest-json-ctrf==0.3.5" in offline
    # Online, uvx brings the packages itself: only the download is checked.
    online = probe_command(needs)
    assert "importlib.metadata" not in online and "astral.sh/uv/0.9.7/install.sh" in online


def test_commands_packages_and_what_is_not_a_command():
    needs = scan_test_script("""#!/bin/bash
set -euo pipefail
# pytest is mentioned in a comment only
cat > /tmp/check.py <<'EOF'
import frobnicate
frobnicate.run()
EOF
cd /app && python -m pytest -q --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py || status=$?
COUNT="$(jq '.items | length' out.json | tr -d ' ')"
for f in a b; do echo "$f"; done
/tests/helper.sh && ./local.sh
if [ "$COUNT" -eq 3 ]; then echo 1 > /logs/verifier/reward.txt; fi
""")
    assert needs.commands == ["cat", "python", "jq", "tr"]
    assert needs.packages == ["pytest", "pytest-json-ctrf"] and not needs.via_uvx
    assert needs.urls == [] and needs.installs == []


def test_functions_and_arithmetic_are_not_programs():
    needs = scan_test_script("""#!/bin/bash
fail() { echo "FAIL: $1"; echo 0 > /logs/verifier/reward.txt; exit 0; }
function note { echo "$@"; }
passed=0; total=0
for case in a b; do
  total=$((total + 1))
  (( passed++ ))
  [ -f "/app/$case" ] || fail "missing $case"
done
note "$passed/$total"
""")
    assert needs.commands == []


def test_read_probe_names_what_is_missing():
    out = '{"command": "jq"}\nnoise\n{"package": "pytest==8.4.1", "found": "7.4.0"}\n{"package": "x", "found": null}\n'
    assert read_probe(out) == ["the command `jq`", "the Python package `pytest==8.4.1` (found 7.4.0)",
                               "the Python package `x`"]
    assert probe_command(scan_test_script("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")) is None
