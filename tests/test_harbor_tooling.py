"""Reading what a task's `tests/test.sh` needs (`raygrpo.envs.harbor.tooling`), on scripts in the shapes task authors
write: Harbor's own `harbor tasks init` template, pytest with `--ctrf`, `python -m pytest`, here-documents, command
substitutions, installs; a table of shell constructs read as bash reads them (issue 43), the real-world scripts of
`tests/harbor_wild/`, and what the bash grammar cannot read (left out, never a command)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from raygrpo.envs.harbor import verify_missing
from raygrpo.envs.harbor.tooling import probe_command, read_probe, scan_test_script, set_aside_named

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


# Each shell construct -> (the commands looked for, the Python packages needed). Nothing in these is unreadable.
CONSTRUCTS = {
    "pipe": ("cat /app/a.txt | grep -v '^#' | sort -u | wc -l\n", {"cat", "grep", "sort", "wc"}, []),
    "2>&1": ("pytest /tests/t.py -rA 2>&1 | tee /logs/verifier/out.txt\n", {"pytest", "tee"}, ["pytest"]),
    "&>": ("make -C /app &> /dev/null || echo 0 > /logs/verifier/reward.txt\n", {"make"}, []),
    ">|": ("jq . /app/out.json >| /tmp/pretty.json\n", {"jq"}, []),
    "<<<": ('grep -q "ok" <<< "$result"\n', {"grep"}, []),
    "fd duplication and closing": ("diff a b >/dev/null 2>/dev/null 1>&2 3<&0 4>&-\n", {"diff"}, []),
    "[ ! -f ]": ("if [ ! -f /app/out.json ]; then echo 0; exit 0; fi\n", set(), []),
    "[ -z $( ) ]": ('[ -z "$(tail -c 1 /app/f.py)" ] && echo empty\n', {"tail"}, []),
    "[[ ! -f && -z ]]": ('[[ ! -f /app/x && -z "$y" || "$a" == b* ]] && echo ok\n', set(), []),
    "[[ =~ ]]": ('[[ "$(uname -m)" =~ ^(x86_64|amd64)$ ]] && echo ok\n', {"uname"}, []),
    "test": ("test -d /app || mkdir -p /app\n", {"mkdir"}, []),
    "if/elif/else": ("if grep -q a f; then sed -i s/a/b/ f; elif awk 1 f; then :; else sort f; fi\n",
                     {"grep", "sed", "awk", "sort"}, []),
    "for": ('for f in /app/*.txt; do md5sum "$f"; done\n', {"md5sum"}, []),
    "for ((;;))": ('for ((i = 0; i < 3; i++)); do seq "$i"; done\n', {"seq"}, []),
    "while read": ('while IFS= read -r line; do cut -d, -f1 <<< "$line"; done < /app/data.csv\n', {"cut"}, []),
    "until": ("until curl -sf http://localhost:8000/health; do sleep 1; done\n", {"curl", "sleep"}, []),
    "case": ('case "$(uname -s)" in\n  Linux) lsb_release -a ;;\n  Darwin|*BSD) sw_vers ;;\n  *) echo no ;;\nesac\n',
             {"uname", "lsb_release", "sw_vers"}, []),
    "functions": ("fail() { echo FAIL; jq . x; exit 1; }\nfunction note { printf '%s\\n' \"$*\"; }\n"
                  "check() (\n  cd /app && node index.js\n)\nfail; note hi; check\n", {"jq", "node"}, []),
    "heredoc": ("cat > /tmp/t.py <<'EOF'\nimport frobnicate\nfrobnicate.run() | x\nEOF\npython3 /tmp/t.py\n",
                {"cat", "python3"}, []),
    "heredoc <<-": ("\tcat <<-EOF\n\tnot a command\n\tEOF\ngrep x y\n", {"cat", "grep"}, []),
    "heredoc, unquoted, with $( )": ("cat <<EOF\nhost: $(hostname)\nEOF\n", {"cat", "hostname"}, []),
    "python3 - heredoc": ("python3 - <<'PY'\nimport json, sys\njson.dump({}, sys.stdout)\nPY\n", {"python3"}, []),
    "heredoc inside $( )": ("DATALOSS=$(python3 << 'PYEOF'\nimport re\nprint('PASS')\nPYEOF\n)\n", {"python3"}, []),
    "$( )": ('COUNT="$(jq \'.items | length\' out.json | tr -d \' \')"\n', {"jq", "tr"}, []),
    "nested $( )": ('x=$(basename "$(dirname "$(readlink -f "$0")")")\n', {"basename", "dirname", "readlink"}, []),
    "backticks": ('n=`ls /app | wc -l`\necho "`date +%s`"\n', {"ls", "wc", "date"}, []),
    "$(( )) and (( ))": ("total=$((total + 1)); (( passed++ )); echo $(( passed * 100 / total ))\n", set(), []),
    "process substitution": ("diff <(sort a) <(sort b) >/dev/null\n", {"diff", "sort"}, []),
    "bash -c": ("bash -c 'cd /app && npm test 2>&1 | tail -n 5'\n", {"bash", "npm", "tail"}, []),
    "sh -c": ('sh -c "[ -f /app/x ] && gzip -t /app/x.gz"\n', {"sh", "gzip"}, []),
    "su -c": ('su nobody -s /bin/bash -c "cd /tmp && timeout 10 python3 /app/solver.py" < in\n',
              {"su", "python3"}, []),
    "bash reading a heredoc": ("bash <<'EOF'\nset -e\njq -n 1\nEOF\n", {"bash", "jq"}, []),
    "python3 -c, multi-line": ('python3 -c "\nimport json\njson.dump({\'reward\': 1}, open(\'/tmp/r\', \'w\'))\n"\n',
                               {"python3"}, []),
    "python3 -c, one line": ("python3 -c 'import sys; print(sys.version)' | head -n1\n", {"python3", "head"}, []),
    "set -euo pipefail": ("#!/bin/bash\nset -euo pipefail\nset -x\nshopt -s nullglob\n", set(), []),
    "uvx --with": ("uvx --with pytest==8.4.1 --with pytest-json-ctrf==0.3.5 pytest --ctrf /logs/c.json /tests\n",
                   {"uvx"}, ["pytest==8.4.1", "pytest-json-ctrf==0.3.5"]),
    "source": ('source "$HOME/.local/bin/env"\n. /tests/lib.sh\n', set(), []),
    "subshell and group": ("(cd /app && make) ; { ls; pwd; } > /tmp/o\n", {"make", "ls"}, []),
    "negation": ("! grep -q bad /app/log && echo fine\n", {"grep"}, []),
    "assignments": ('FOO=1 BAR="$(id -u)" env -i node x.js\nexport PATH="/opt/bin:$PATH"\nlocal_var=2\n',
                    {"id", "node"}, []),
    "wrappers": ("timeout 10 python3 x.py; sudo -u nobody cat f; nohup sleep 1 &\nexec java -jar a.jar\n",
                 {"python3", "cat", "sleep", "java"}, []),
    "command -v asks, runs nothing": ("command -v jq >/dev/null || echo no jq\n", set(), []),
    "line continuations": ("python3 -m pytest \\\n  -q \\\n  /tests/test_outputs.py\n", {"python3"}, ["pytest"]),
    "comments": ("# jq is mentioned here\necho hi  # and grep here\n", set(), []),
    "arrays": ('files=(/app/*.log)\nfor f in "${files[@]}"; do gzip "$f"; done\n', {"gzip"}, []),
    "declarations": ("declare -A seen=()\nreadonly X=$(whoami)\nlocal y=1 2>/dev/null || true\n", {"whoami"}, []),
    "programs named by a variable": ('"$PYTHON" -m pytest; $CMD arg; ${TOOL:-jq} .\n', set(), []),
    "paths": ("/usr/bin/env python3 x; ./run.sh; ../x; /tests/helper.sh\n", {"python3"}, []),
}


@pytest.mark.parametrize("script, commands, packages", CONSTRUCTS.values(), ids=CONSTRUCTS.keys())
def test_each_shell_construct_yields_exactly_the_programs_it_runs(script, commands, packages):
    needs = scan_test_script(script)
    assert set(needs.commands) == commands and len(needs.commands) == len(commands)
    assert needs.packages == packages
    assert needs.unread == []


#: The three misreadings of issue 43: each reported a command that is not one ("the command `1`", "`-f`", "`import`"
#: and "`json.dump`"), which turned a real verdict into `verifier_error`.
ISSUE_43 = {
    "noop whose tests fail, 2>&1": ("""#!/bin/bash
cd /app
pytest /tests/test_outputs.py -rA 2>&1 | tee /logs/verifier/pytest.log
if [ "${PIPESTATUS[0]}" -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
""", ["pytest", "tee"], ["pytest"]),
    "multi-reward, [ ! -f ]": ("""#!/bin/bash
mkdir -p /logs/verifier
if [ ! -f /app/out.json ]; then
  echo '{"correct": 0, "style": 0}' > /logs/verifier/reward.json
  exit 0
fi
correct=$(jq -r '.ok' /app/out.json)
echo "{\\"correct\\": $correct, \\"style\\": 1}" > /logs/verifier/reward.json
""", ["mkdir", "jq"], []),
    "no reward, multi-line python3 -c": ("""#!/bin/bash
python3 -c "
import json
json.dump({'checked': True}, open('/tmp/report.json', 'w'))
"
pytest /tests/test_outputs.py
""", ["python3", "pytest"], ["pytest"]),
}


@pytest.mark.parametrize("script, commands, packages", ISSUE_43.values(), ids=ISSUE_43.keys())
def test_issue_43_the_probe_finds_nothing_missing_where_everything_the_script_runs_is_there(
        script, commands, packages, tmp_path):
    needs = scan_test_script(script)
    assert (needs.commands, needs.packages, needs.unread) == (commands, packages, [])
    # A sandbox with exactly what the script runs, and a python3 with pytest (this interpreter): the probe, run by
    # bash itself, reports nothing.
    for program in {*commands, "python3"}:
        body = f'exec {shlex.quote(sys.executable)} "$@"' if program == "python3" else "exit 0"
        (tmp_path / program).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / program).chmod(0o755)
    bash = shutil.which("bash")
    assert bash is not None
    env = {**os.environ, "PATH": str(tmp_path)}
    out = subprocess.run([bash, "-c", probe_command(needs)], env=env, capture_output=True, text=True, timeout=20)
    assert read_probe(out.stdout) == [], out
    # Without them, it names each of them, and nothing else.
    for program in commands:
        (tmp_path / program).unlink()
    out = subprocess.run([bash, "-c", probe_command(needs)], env=env, capture_output=True, text=True, timeout=20)
    assert set(read_probe(out.stdout)) == {f"the command `{c}`" for c in commands}, out


WILD = Path(__file__).with_name("harbor_wild")
#: What the scan reads off each real-world task's test.sh (tests/harbor_wild and the local examples).
WILD_COMMANDS = {
    "access-log-5xx": ["mkdir", "pytest"],
    "backup-tarball-python3": ["mkdir", "python3"],
    "csv-revenue-by-region": ["mkdir", "pytest"],
    "dedupe-emails-no-reward": ["mkdir", "pytest"],
    "fibonacci-uvx-template": ["apt-get", "sh"],
    "fix-median-relative": ["mkdir", "python3"],
    "fizzbuzz-named-rewards": ["mkdir", "python3", "grep", "awk", "tail"],
    "gzip-logs-init-nopytest": ["mkdir", "gzip", "zcat", "cat", "tr"],
    "merge-intervals-nobody": ["mkdir", "chmod", "su", "python3", "cat", "basename", "head"],
    "primes-init-shared": ["apt-get", "sh"],
    "release-symlink-no-mkdir": ["readlink", "grep", "head", "tail"],
    "slugify-module": ["mkdir", "pytest"],
    "top-words-python-alias": ["mkdir", "python"],
    "separate-verifier-wordcount": ["pytest"],
    "multi-step-notes/steps/step-1": ["apt-get", "sh"],
    "multi-step-notes/steps/step-2": ["apt-get", "sh"],
    # `expect` and `finish` are functions of the task's shared /tests/lib.sh, which the scan of one script cannot see.
    "wordfreq-cli/steps/build": ["expect", "finish"],
    "wordfreq-cli/steps/filter": ["expect", "finish"],
    "wordfreq-cli/steps/document": ["expect", "python3", "finish"],
    "count-words": ["mkdir", "tr"],
    "create-greeting": ["mkdir", "cat"],
    "find-largest-file": ["mkdir", "tr"],
    "fix-json-config": ["mkdir", "python3"],
    "fix-mean-bug": ["mkdir", "python3"],
    "lowercase-extensions": ["mkdir", "ls", "cat", "tr"],
    "sort-unique-names": ["mkdir", "cat"],
    "sum-csv-column": ["mkdir", "tr"],
    "write-fizzbuzz": ["mkdir", "python3"],
}


def _wild_scripts() -> dict[str, Path]:
    examples = Path(__file__).resolve().parent.parent / "examples" / "harbor_local" / "tasks"
    found = {}
    for root in (WILD / "tasks", WILD / "unsupported", WILD / "multi_step", examples):
        for script in sorted(root.glob("**/tests/test.sh")):
            found[script.parent.parent.relative_to(root).as_posix()] = script
    return found


def test_every_real_world_test_script_is_read_as_bash_reads_it():
    scripts = _wild_scripts()
    assert sorted(scripts) == sorted(WILD_COMMANDS)
    for name, script in scripts.items():
        needs = scan_test_script(script.read_text())
        assert (name, needs.commands, needs.unread) == (name, WILD_COMMANDS[name], [])


@pytest.mark.parametrize("script, kept", [
    ("mkdir -p /logs\nf() {\n  jq . x\n", ["mkdir"]),  # an unclosed function: not a command `f`
    ("[ \\( -f a \\) -o -f b ] && jq . x\nmkdir -p /logs\n", []),  # a gap of the grammar
    ("shopt -s extglob\nls @(a|b)\n", []),  # would read as commands `a` and `b`
    ('echo "unterminated\nimport json\njson.dump(x)\n', []),
    ("python3 -c 'import json\njson.dump(x)\n", []),
    ("mkdir -p /x\ncat <<EOF1 && cat <<EOF2\nimport a\nEOF1\nimport b\nEOF2\nwc -l f\n", ["mkdir", "cat"]),
])
def test_what_the_grammar_cannot_read_is_left_out_never_guessed(script, kept):
    needs = scan_test_script(script)
    assert needs.commands == kept
    assert needs.unread


def test_scripts_of_another_interpreter_need_only_it_and_urls_must_be_written_out():
    assert scan_test_script("#!/usr/bin/env python3\nimport json\nprint(json.dumps({}))\n").commands == ["python3"]
    assert scan_test_script("#!/usr/bin/env -S bash -e\n[ ! -f x ] && jq .\n").commands == ["jq"]
    needs = scan_test_script('V=1.2\ncurl -fsSL "https://example.com/v${V}/x.sh" | bash\nwget -q https://a.b/c\n')
    assert needs.urls == ["https://a.b/c"] and needs.commands == ["curl", "bash", "wget"]
    needs = scan_test_script('uvx --with "$SPEC" --with rich==13.0 pytest -q\n')
    assert needs.packages == ["rich==13.0", "pytest"] and needs.via_uvx


# What test.sh `pip install`s -> the specs checked in the sandbox's python3 (`pip_packages`).
PIP_INSTALLS = {
    "pip": ("pip install pytest==8.4.1 numpy==1.26.4\npytest /tests/t.py\n", ["pytest==8.4.1", "numpy==1.26.4"]),
    "pip3, options, ranges, extras": ('pip3 install -q --no-cache-dir -U "pandas[excel]==2.1.0" "scipy>=1.10" rich\n',
                                      ["pandas==2.1.0", "scipy", "rich"]),
    "python3 -m pip": ("python3 -m pip install --break-system-packages numpy==1.26.4\n", ["numpy==1.26.4"]),
    "uv pip": ("uv pip install --system polars==1.0.0\n", ["polars==1.0.0"]),
    "sudo, pip's own options, an index": (
        "sudo pip --disable-pip-version-check install -i https://x/simple rich==13.0\n", ["rich==13.0"]),
    "paths, URLs, archives, -r, -e, expansions": (
        'pip install -r /tests/req.txt -e /app ./pkg /tmp/a.whl git+https://x/y.git "$PKG" pkg@https://x/p.zip\n', []),
    "into another environment": ("pip install --target /tmp/lib numpy\npip install --prefix=/opt/p scipy\n", []),
    "into a venv the script makes": ("python3 -m venv /tmp/v\nsource /tmp/v/bin/activate\npip install numpy\n", []),
    "into uv's venv": ("uv venv\nuv pip install numpy\n", []),
    "not an install": ("pip download numpy\npip show pytest\npip list\n", []),
}


@pytest.mark.parametrize("script, specs", PIP_INSTALLS.values(), ids=PIP_INSTALLS.keys())
def test_what_test_sh_pip_installs_is_read_as_its_requirements(script, specs):
    needs = scan_test_script(script)
    assert needs.pip_packages == specs and needs.unread == []


def test_pip_installed_packages_are_checked_in_python3_even_where_uvx_brings_its_own(tmp_path):
    """Online, uvx's `--with` specs are uvx's to download; what test.sh pip-installs is checked in the python3 the
    tests run (here: this interpreter), named when missing or at another version."""
    import pytest as this_pytest

    needs = scan_test_script("uvx --with nosuch-with-spec==1.0 pytest -q\n"
                             "pip install pytest==0.0.1 raygrpo-no-such-dist\n")
    assert needs.via_uvx and needs.packages == ["nosuch-with-spec==1.0", "pytest"]
    assert needs.pip_packages == ["pytest==0.0.1", "raygrpo-no-such-dist"]
    (tmp_path / "python3").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    (tmp_path / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    out = subprocess.run(["bash", "-c", probe_command(needs)], env=env, capture_output=True, text=True, timeout=20)
    assert [p for p in read_probe(out.stdout) if "package" in p] == [
        f"the Python package `pytest==0.0.1` (found {this_pytest.__version__})",
        "the Python package `raygrpo-no-such-dist`"], out


def test_commands_the_instruction_names_are_the_models_to_make():
    """A command named in the instruction's Markdown code, or as the last part of a path in it, is the model's to
    make: not looked for. The Python runners are looked for whatever it says; plain prose names nothing."""
    needs = scan_test_script("wordstat a\n/usr/local/bin/tally b\n/opt/verifier-venv/bin/pytest -q\npytest -q\n"
                             "jq . x\nmake -C /app\nsort f\n")
    instruction = ("Create an executable command `wordstat` in /app/bin, and the CLI /usr/local/bin/tally.\n"
                   "Make sure both work; sort nothing by hand, use jq if you like.\n"
                   "```bash\n$ wordstat notes.txt\n```\n"
                   "The tests run `pytest` (`/opt/verifier-venv/bin/pytest -q`).\n")
    assert set_aside_named(needs, ["Step one.", instruction]) == ["wordstat", "/usr/local/bin/tally"]
    assert needs.commands == ["/opt/verifier-venv/bin/pytest", "pytest", "jq", "make", "sort"]
    assert set_aside_named(scan_test_script("wordstat a\n"), ["Count words with a tool of yours."]) == []


def test_bash_s_line_for_a_path_it_cannot_run_is_read_for_the_path(tmp_path):
    """Bash prints `<script>: line N: /path: No such file or directory` for a command given by a path it cannot
    run; `verify_missing` reads the paths off such lines (a `cd` or a missing interpreter is not one)."""
    script = tmp_path / "test.sh"
    script.write_text("#!/bin/bash\n/opt/raygrpo-no-such/bin/pytest -q\ncd /opt/raygrpo-no-such\n"
                      "bash -c /opt/raygrpo-no-such/tool\ncat /opt/raygrpo-no-such/file\n")
    output = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=20).stderr
    (tmp_path / "out.txt").write_text(output + "/tests/test.sh: line 3: /x/y: /bin/nope: bad interpreter: "
                                               "No such file or directory\n")
    found = subprocess.run(["sed", "-n", verify_missing.MISSING_PATHS, str(tmp_path / "out.txt")],
                           capture_output=True, text=True, timeout=20).stdout.split()
    assert found == ["/opt/raygrpo-no-such/bin/pytest", "/opt/raygrpo-no-such/tool"], output
    assert verify_missing.OUTPUT == "/logs/verifier/test-stdout.txt"
    assert verify_missing.MISSING_PATHS in verify_missing.read_command().replace("'", "")
