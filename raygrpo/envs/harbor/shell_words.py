"""The simple commands of a shell script as bash reads them, from a real bash grammar (tree-sitter-bash).

`raygrpo.envs.harbor.tooling` needs to know which programs a task's `tests/test.sh` runs. Reading that off the text
(tokens after `;`, `|`, `(`, ...) misreads ordinary shell: `2>&1` yields a command `1`, `[ ! -f x ]` a command `-f`,
the body of a multi-line `python3 -c "..."` commands `import` and `json.dump`. A missing command that is not one sets
a real verdict aside, so the script is parsed instead, and each simple command is kept with its words:

- pipelines, lists, `if`/`for`/`while`/`until`/`case`, subshells, groups and function bodies are walked into;
  `[ ]`, `[[ ]]` and arithmetic (`(( ))`, `$(( ))`, `for ((;;))`) hold no commands; redirections (`2>&1`, `&>`,
  `>|`, `<<<`) are not words; here-document bodies are data, except the command substitutions of an unquoted one;
- command substitutions (`$( )`, backticks, inside double quotes and here-documents too) and process substitutions
  are commands of their own;
- a word is kept with its quotes removed and marked literal only when no expansion is in it (`"$HOME/bin/x"` is not);
- wrappers that run the rest of their words (`sudo -u nobody`, `timeout 10`, `env A=1`, `nohup`, `exec`, `time`,
  `coproc`) are taken off: the command is the program they run (`command -v X` only asks about X and is kept whole);
- the script a shell is given (`bash -c BODY`, `sh -c`, `su USER -c BODY`, a here-document or here-string fed to
  `bash`) is read as a script too.

What the grammar cannot read (an `ERROR` or missing node, a command containing one, and the commands right next to
one, which error recovery may have cut short: an unclosed `f() {` reads as a command `f`) is left out and named in
`ShellScript.unread`: a word the parser could not place is never reported as a command. On valid bash the grammar's
known gaps (`[ \\( ... \\) ]`, `\\<` in `[ ]`, two here-documents started on one line joined by `&&`, a here-document
followed by `2>&1 |`) end up there, costing a check, never adding a command.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

#: Shells whose `-c BODY` (or standard input) is a script; `su` and `runuser` hand `-c BODY` to one.
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox"})
SWITCH_USER = frozenset({"su", "runuser"})
#: Wrapper -> its options that take a value; what follows the wrapper's options (and, for `timeout`, its duration;
#: for `env`, its `NAME=value` words) is the command it runs.
WRAPPERS: dict[str, frozenset[str]] = {
    "sudo": frozenset("-u -g -C -D -h -p -r -t -U -T --user --group --close-from --chdir --host --prompt --role "
                      "--type --other-user --command-timeout".split()),
    "env": frozenset("-u -C -S --unset --chdir --split-string".split()),
    "timeout": frozenset("-s -k --signal --kill-after".split()),
    "nohup": frozenset(),
    "exec": frozenset({"-a"}),
    "command": frozenset(),
    "time": frozenset({"-f", "-o", "--format", "--output"}),
    "coproc": frozenset(),
}
_SU_VALUE_OPTIONS = frozenset("-s -g -G -w -u --shell --group --supp-group --whitelist-environment --user".split())
_SHELL_VALUE_OPTIONS = frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})
#: How deep `bash -c '... bash -c "..."'` is followed.
MAX_NESTING = 4
_DQ_ESCAPABLE = frozenset('$`"\\\n')


@dataclass(frozen=True)
class Word:
    """One word of a simple command.

    Args:
        text: The word with its quotes and escapes removed; expansions (`$X`, `${X}`, `$(...)`) kept as written.
        literal: `text` is exactly what bash passes (no expansion in the word).
    """

    text: str
    literal: bool

    @property
    def value(self) -> str | None:
        """The word as bash passes it; None when it depends on an expansion."""
        return self.text if self.literal else None


@dataclass(frozen=True)
class SimpleCommand:
    """A simple command: the program it runs (first) and its arguments, less assignments and redirections and less
    the wrappers that run it (`sudo -u nobody`, `timeout 10`, ...)."""

    words: tuple[Word, ...]

    @property
    def program(self) -> str | None:
        """The program's name as written; None when it is an expansion (`$PYTHON`, `"$(which python3)"`)."""
        return self.words[0].value if self.words else None

    @property
    def values(self) -> list[str | None]:
        """Each word as bash passes it, None where it depends on an expansion."""
        return [w.value for w in self.words]


@dataclass
class ShellScript:
    """What `read_script` found, in the order of the script.

    Args:
        commands: Every simple command, nested ones included (substitutions, function bodies, `bash -c` bodies).
        functions: The functions the script defines (commands by those names are not programs).
        unread: The start of each part the grammar could not read, left out of `commands`.
    """

    commands: list[SimpleCommand] = field(default_factory=list)
    functions: set[str] = field(default_factory=set)
    unread: list[str] = field(default_factory=list)


@functools.cache
def _bash() -> Language:
    return Language(tree_sitter_bash.language())


def _parser() -> Parser:
    """A parser of bash (a new one each time: a parser is not safe to share between threads, and costs a
    microsecond)."""
    return Parser(_bash())


def read_script(text: str) -> ShellScript:
    """The simple commands, functions and unreadable parts of the shell script `text` (see the module docstring)."""
    script = ShellScript()
    _read_into(script, text, depth=0)
    return script


def script_interpreter(text: str) -> str | None:
    """The program a `#!` line names when it is not a shell (`python3` for `#!/usr/bin/env python3`): such a script
    is not shell, and only that program is run. None for shell scripts and scripts without a `#!` line."""
    if not text.startswith("#!"):
        return None
    words = text[2:].split("\n", 1)[0].split()
    if words and _basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    if not words or _basename(words[0]) in SHELLS:
        return None
    return words[0]


def _basename(program: str) -> str:
    return program.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class _Visit:
    """A syntax node to read, with its parent (a here-document belongs to the statement around a command) and
    whether its statement borders on what the grammar could not read."""

    node: Node
    parent: Node | None
    near_error: bool


def _read_into(script: ShellScript, text: str, depth: int) -> None:
    """Add what the script `text` holds to `script`; `depth`: how many `bash -c` bodies deep it is.

    Walked with a stack, parents carried along: a tree-sitter node finds its parent and siblings by walking down from
    the root, which a long `a && b && ...` chain makes quadratic."""
    source = text.encode("utf-8", errors="replace")
    stack = [_Visit(_parser().parse(source).root_node, None, False)]
    while stack:
        visit = stack.pop()
        node = visit.node
        if node.is_error or node.is_missing:
            script.unread.append(_snippet(node) if node.is_error else f"(missing {node.type})")
            continue
        if node.type == "function_definition":
            name = node.child_by_field_name("name")
            if name is not None and name.text:
                script.functions.add(name.text.decode(errors="replace"))
        elif node.type == "command":
            if node.has_error or visit.near_error:
                script.unread.append(_snippet(node))
                continue
            words = _command_words(node)
            if words:
                command = SimpleCommand(_unwrapped(words))
                script.commands.append(command)
                if depth < MAX_NESTING:
                    for body in _scripts_given(command, node, visit.parent):
                        _read_into(script, body, depth + 1)
        stack.extend(reversed(_children(node, visit.near_error)))


def _children(node: Node, near_error: bool) -> list[_Visit]:
    """The children of `node` to read. Error recovery cuts a statement at the error (`f() {` left unclosed reads as
    a command `f` and an error), so a child next to an error, or to a command holding one, is not to be trusted; the
    body of a redirected statement is as trusted as the statement."""
    children = [c for c in node.children if c.is_named or c.is_missing]  # tokens (`;`, `&&`, quotes) hold nothing
    if node.type == "redirected_statement":
        return [_Visit(child, node, near_error) for child in children]
    broken = [c.is_error or c.is_missing or (c.type == "command" and c.has_error) for c in children]
    return [_Visit(child, node, (i > 0 and broken[i - 1]) or (i + 1 < len(children) and broken[i + 1]))
            for i, child in enumerate(children)]


def _snippet(node: Node) -> str:
    text = (node.text or b"").decode(errors="replace").strip()
    return text.split("\n", 1)[0][:80]


def _command_words(node: Node) -> list[Word]:
    name = node.child_by_field_name("name")
    if name is None:
        return []
    parts = [name.named_children[0] if name.named_children else name]
    parts += node.children_by_field_name("argument")
    return [_word(part) for part in parts]


def _word(node: Node) -> Word:
    """`node` as a word: quotes and escapes removed, expansions kept as written (and the word then not literal)."""
    raw = (node.text or b"").decode(errors="replace")
    kind = node.type
    if kind == "word":
        return Word(_unescape(raw, lambda c: True), True)
    if kind == "number":
        return Word(raw, True)
    if kind == "raw_string":
        return Word(raw[1:-1], True)
    if kind == "string":
        return _double_quoted(node)
    if kind == "concatenation":
        parts = [_word(child) for child in node.children]
        return Word("".join(p.text for p in parts), all(p.literal for p in parts))
    return Word(raw, False)  # an expansion, a substitution, `$'...'`, a brace expansion, ...


def _double_quoted(node: Node) -> Word:
    """A `"..."` word: its text between the quotes, escapes removed between the expansions it holds."""
    source = node.text or b""
    start, end = node.start_byte, node.end_byte
    pieces: list[str] = []
    literal = True
    cursor = start + 1
    for child in node.named_children:
        if child.type == "string_content":
            continue
        literal = False
        pieces.append(_unescape(source[cursor - start: child.start_byte - start].decode(errors="replace"),
                                lambda c: c in _DQ_ESCAPABLE))
        pieces.append((child.text or b"").decode(errors="replace"))
        cursor = child.end_byte
    pieces.append(_unescape(source[cursor - start: end - 1 - start].decode(errors="replace"),
                            lambda c: c in _DQ_ESCAPABLE))
    return Word("".join(pieces), literal)


def _unescape(text: str, escapable: Callable[[str], bool]) -> str:
    """`text` with bash's backslash escapes removed (`escapable(c)`: whether `\\c` stands for `c`)."""
    if "\\" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text) and escapable(text[i + 1]):
            if text[i + 1] != "\n":  # a backslash-newline joins lines
                out.append(text[i + 1])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _unwrapped(words: list[Word]) -> tuple[Word, ...]:
    """`words` less the wrappers (and their options) that run the rest: `sudo -u nobody cat f` runs `cat f`."""
    while len(words) > 1 and words[0].value is not None and _basename(words[0].text) in WRAPPERS:
        wrapper = _basename(words[0].text)
        rest = words[1:]
        if wrapper == "command" and rest[0].value in ("-v", "-V"):
            break  # `command -v X` asks whether X exists; it runs nothing
        takes_value = WRAPPERS[wrapper]
        while rest and rest[0].value is not None and rest[0].text.startswith("-") and rest[0].text != "-":
            option = rest.pop(0).text
            if option == "--":
                break
            if option in takes_value and rest:
                rest.pop(0)
        if wrapper == "timeout" and rest:
            rest.pop(0)  # the duration
        if wrapper == "env":
            while rest and rest[0].value is not None and "=" in rest[0].text:
                rest.pop(0)
        if not rest:
            break
        words = rest
    return tuple(words)


def _scripts_given(command: SimpleCommand, node: Node, parent: Node | None) -> list[str]:
    """The scripts `command` hands to a shell: `bash -c BODY`, `su USER -c BODY`, or what a shell reading its
    standard input gets from a here-document or here-string (`node` is the command's syntax node, `parent` the
    node it is in)."""
    values = command.values
    program = _basename(values[0] or "")
    if program in SWITCH_USER:
        i = 1
        while i < len(values):
            value = values[i]
            if value in ("-c", "--command") and i + 1 < len(values):
                return [command.words[i + 1].text]
            if value is not None and value.startswith("--command="):
                return [command.words[i].text.split("=", 1)[1]]
            i += 2 if value in _SU_VALUE_OPTIONS else 1
        return []
    if program not in SHELLS:
        return []
    i, from_string, from_stdin = 1, False, False
    while i < len(values):
        value = values[i]
        if value is None or not value.startswith(("-", "+")) or value in ("-", "--"):
            break
        if value in _SHELL_VALUE_OPTIONS:
            i += 1
        elif not value.startswith("--"):
            from_string = from_string or "c" in value[1:]
            from_stdin = from_stdin or "s" in value[1:]
        i += 1
    if from_string:
        return [command.words[i].text] if i < len(values) else []
    if i < len(values) and not from_stdin:
        return []  # `bash script.sh`: a script file
    return _stdin_scripts(node, parent)


def _stdin_scripts(node: Node, parent: Node | None) -> list[str]:
    """The here-documents and here-strings a command's standard input gets (its own redirections and those of the
    statement it is the body of)."""
    redirects = list(node.children_by_field_name("redirect"))
    if parent is not None and parent.type == "redirected_statement":
        redirects += parent.children_by_field_name("redirect")
    scripts: list[str] = []
    for redirect in redirects:
        if redirect.type == "heredoc_redirect":
            scripts += [(c.text or b"").decode(errors="replace") for c in redirect.children if c.type == "heredoc_body"]
        elif redirect.type == "herestring_redirect" and redirect.named_children:
            scripts.append(_word(redirect.named_children[0]).text)
    return scripts
