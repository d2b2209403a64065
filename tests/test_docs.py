"""The README and `docs/`: every page reachable, every link sound, every module placed, every YAML block a config that
loads, and the library example run.

The README stays short and points into `docs/`; these checks keep the pages from drifting away from the tree: a page
nobody links is lost, a link to a moved file or heading is a dead end, and a module missing from
`docs/architecture.md` is a room nobody can find; a YAML block that no longer loads teaches a config that fails.
The Python example of `docs/library.md` is run as it stands.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections import deque
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PACKAGE = ROOT / "raygrpo"

#: A Markdown link or image: `[text](target)`, target without spaces.
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _prose(page: Path) -> str:
    """The page without its fenced code blocks (a link inside one is code, not a link)."""
    return _FENCE.sub("", page.read_text())


def _relative_links(page: Path) -> list[str]:
    return [t for t in _LINK.findall(_prose(page)) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(page).splitlines():
        match = re.match(r"^#{1,6} (.+)$", line)
        if match:
            slug = _slug(match.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


pytestmark = pytest.mark.timeout(60)


def test_the_readme_is_short_and_keeps_the_quick_start():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    quick = text[text.index("## Quick start"):]
    block = quick[quick.index("```bash"):quick.index("```", quick.index("```bash") + 3)]
    assert re.search(r"^make train\b", block, re.M) and re.search(r"^make test\b", block, re.M), block
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^train:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def test_every_docs_page_is_linked_from_the_readme_or_a_linked_page():
    reached = {README}
    todo = deque([README])
    while todo:
        page = todo.popleft()
        for target in _relative_links(page):
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if path.suffix == ".md" and path.parent == DOCS and path not in reached:
                reached.add(path)
                todo.append(path)
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in reached]
    assert unlinked == []


def test_every_relative_link_resolves():
    broken = []
    for page in _pages():
        for target in _relative_links(page):
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_the_link_checks_catch_a_dead_link_and_anchor(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n## `raygrpo check`\n\n[a](nope.md) [b](#raygrpo-check) [c](https://x.y/z) [d](#gone)\n"
                    "```\n[e](inside-code.md)\n```\n")
    assert _relative_links(page) == ["nope.md", "#raygrpo-check", "#gone"]
    assert _anchors(page) == {"top", "raygrpo-check"}


#: A YAML block and the line before it; a block that is not a whole run config says so on that line with an HTML
#: comment (`<!-- fragment: why -->`), which the page does not show.
_YAML_BLOCK = re.compile(r"^([^\n]*)\n```yaml\n(.*?)^```", re.S | re.M)


def _yaml_blocks(page: Path) -> list[tuple[int, str, bool]]:
    """`(line, block, fragment)` for each ```yaml block of `page`."""
    text = page.read_text()
    return [(text.count("\n", 0, m.start(2)) + 1, m.group(2), "<!-- fragment" in m.group(1))
            for m in _YAML_BLOCK.finditer(text)]


def test_every_yaml_block_is_a_config_that_loads(tmp_path):
    """Every ```yaml block of the README and docs/ loads as a run config (`load_config`: fields, not the files they
    name), unless it is marked as a fragment; a page with a block that does not, or an unmarked fragment, fails."""
    from raygrpo.config.loading import load_config

    failures, loaded = [], 0
    for page in _pages():
        for line, block, fragment in _yaml_blocks(page):
            if fragment:
                continue
            config = tmp_path / f"{page.stem}-{line}.yaml"
            config.write_text(block)
            try:
                load_config(str(config))
                loaded += 1
            except Exception as exc:  # noqa: BLE001 - every failing block listed at once
                failures.append(f"{page.relative_to(ROOT)}:{line}: {str(exc)[:400]}")
    assert not failures, "\n".join(failures)
    assert loaded >= 4  # the README's two and configuration.md's two, at least


def test_every_module_is_named_in_the_architecture_page():
    text = (DOCS / "architecture.md").read_text()
    missing = []
    for file in sorted(PACKAGE.rglob("*.py")):
        if file.name in ("__init__.py", "__main__.py"):
            continue
        rel = file.relative_to(ROOT).as_posix()
        if f"`{rel}`" not in text:
            missing.append(rel)
    assert missing == []


def _python_block(page: Path) -> str:
    match = re.search(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)
    assert match, f"{page.name} has no python block"
    return match.group(1)


@pytest.mark.ray
@pytest.mark.timeout(360)
def test_the_library_example_runs_as_written(tmp_path):
    """The first Python block of docs/library.md, run in a fresh interpreter from a folder that looks like the
    repository's root (its `examples/`), so the run and its policy file land in the test's own folder."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    script = tmp_path / "library_example.py"
    script.write_text(_python_block(DOCS / "library.md"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:  # the interpreter and the Ray processes it started
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            for p in tree:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
            psutil.wait_procs(tree, timeout=20)
    assert proc.returncode == 0, err[-4000:]
    assert out.splitlines()[0] == "4 1.0 {'ok': 4} 0", out
    assert (tmp_path / "runs" / "echo-library" / "summary.json").is_file()
