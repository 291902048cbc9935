"""The docs point at things that exist: every relative link in README.md and docs/*.md names a file of the
repository, every page in docs/ is linked from the README, and every message docs/troubleshooting.md quotes is
one tune prints (a string, or an f-string whose placeholders stand for the values, in tune/ or recipes/)."""

import ast
import functools
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
TROUBLESHOOTING = REPO / "docs" / "troubleshooting.md"
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)
_ANY = "\0"  # a placeholder of the code's messages, an elision ("...") of the quoted ones
# What tune puts in front of a message, stripped one at a time (each stage is tried): the CLI's and the recipes'
# `tune: error: ` / `<recipe>.py: error: ` (tune/_cli/main.py, tune/config/_parse.py; `<recipe>` stands for any
# recipe), the log's `LEVEL:logger: ` (tune/utils/_logging.py), a ConfigError's `CONFIG: ` and a problem's
# `key = 'value': ` (tune/config/_errors.py), instantiate's `key: path rejected its arguments: `
# (tune/config/_instantiate.py), and any other `word: ` (`resume_from_checkpoint: ` of tune/training).
_WRAPPERS = [
    re.compile(r"tune: (?:error|warning): "),
    re.compile(r"<recipe>\.py: error: "),
    re.compile(r"(?:ERROR|WARNING|INFO):[\w.]+: "),
    re.compile(r"[\w.\[\]]+: [\w.]+ rejected its arguments: "),
    re.compile(r"[\w.\[\]]+ = '[^']*': "),
    re.compile(r"\S+: "),
]
_MIN_LITERAL = 20  # a code string counts as a message from this many characters of its own text
_MIN_ANCHOR = 12  # ... and must share a stretch of its text this long with the quoted message


def _pages() -> list[Path]:
    return [README, *sorted((REPO / "docs").glob("*.md"))]


def _links(path: Path) -> list[str]:
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))  # code blocks hold no links
    return [target for target in _LINK.findall(text) if "://" not in target and not target.startswith("mailto:")]


def test_every_relative_link_names_a_file_of_the_repository():
    checked = 0
    for page in _pages():
        for target in _links(page):
            path = target.split("#", 1)[0]
            if not path:
                continue  # a link within the page
            resolved = (page.parent / path).resolve()
            assert resolved.exists(), f"{page.relative_to(REPO)} links to {target}, which does not exist"
            assert resolved.is_relative_to(REPO), f"{page.relative_to(REPO)} links outside the repository: {target}"
            checked += 1
    print(f"{checked} relative links checked in {len(_pages())} pages")
    assert checked > 20


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(REPO / target.split("#", 1)[0]).resolve() for target in _links(README)}
    missing = [p.name for p in sorted((REPO / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"README.md links none of {missing}; add them to its Docs list"


# ------------------------------------------------------------------------------ quoted messages


def _template(node: ast.AST) -> str | None:
    """The text of a string expression, its placeholders as _ANY: a constant, an f-string, or a `+` of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else _ANY for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        if left is None and right is None:
            return None
        return (_ANY if left is None else left) + (_ANY if right is None else right)
    return None


@functools.cache
def _code_messages() -> tuple[tuple[str, tuple[str, ...], re.Pattern], ...]:
    """Every string of tune/ and recipes/ with enough text of its own: (text, its literal stretches, a regex)."""
    found = set()
    for folder in ("tune", "recipes"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                text = _template(node)
                if text is not None and len(text.replace(_ANY, "")) >= _MIN_LITERAL:
                    found.add(re.sub(f"{_ANY}+", _ANY, text))
    messages = []
    for text in sorted(found):
        pieces = tuple(p for p in text.split(_ANY) if len(p) >= _MIN_ANCHOR)
        pattern = re.compile(".*?".join(re.escape(p) for p in text.split(_ANY)), flags=re.S)
        messages.append((text, pieces, pattern))
    return tuple(messages)


def _same_message(quoted: str, code: str) -> bool:
    """Whether one text can be both: ``_ANY`` in either stands for any text (a value, or an elided stretch).

    An elision can stand for the code's text too, so what follows a "..." is checked only against what follows in
    the code: quote messages whole where it matters."""
    n, m = len(quoted), len(code)
    # able[j]: quoted[i:] and code[j:] can be the same text, computed from i = n down to 0
    able = [False] * (m + 1)
    able[m] = True
    for j in range(m - 1, -1, -1):
        able[j] = code[j] == _ANY and able[j + 1]
    for i in range(n - 1, -1, -1):
        below, able = able, [False] * (m + 1)
        able[m] = quoted[i] == _ANY and below[m]
        for j in range(m - 1, -1, -1):
            if quoted[i] == _ANY:
                able[j] = below[j] or able[j + 1]
            elif code[j] == _ANY:
                able[j] = able[j + 1] or below[j]
            else:
                able[j] = quoted[i] == code[j] and below[j + 1]
    return able[0]


def _unwrapped(message: str) -> list[str]:
    """``message`` and what is left of it after taking off each prefix tune puts in front, one after the other."""
    stages, text = [message], message
    while True:
        match = next((m for w in _WRAPPERS if (m := w.match(text))), None)
        if match is None:
            return stages
        text = text[match.end() :]
        stages.append(text)


def _quoted_messages() -> list[str]:
    """Every message in the ```text blocks of docs/troubleshooting.md: lines wrapped at spaces, joined again;
    messages in one block are separated by a blank line."""
    text = TROUBLESHOOTING.read_text(encoding="utf-8")
    messages = []
    for block in re.findall(r"^```text\n(.*?)^```", text, flags=re.S | re.M):
        for message in block.strip().split("\n\n"):
            messages.append(" ".join(line.strip() for line in message.splitlines()))
    return messages


def _printed_by_tune(message: str) -> bool:
    for body in _unwrapped(message):
        body = body.replace("...", _ANY)
        for text, pieces, pattern in _code_messages():
            if not any(piece in body for piece in pieces):
                continue
            if _ANY not in body and pattern.fullmatch(body):
                return True
            if _ANY in body and _same_message(body, text):
                return True
    return False


def test_troubleshooting_quotes_only_messages_tune_prints():
    messages = _quoted_messages()
    print(f"{len(messages)} messages quoted in docs/troubleshooting.md")
    assert len(messages) >= 10
    for message in messages:
        assert _printed_by_tune(message), f"no string in tune/ or recipes/ reads: {message}"


def test_the_message_check_refuses_a_message_tune_does_not_print():
    message = (
        "The training loss is nan at step 3; stopping so no checkpoint is written from diverged weights (the last "
        "saved checkpoint is intact). Common fixes: lower the learning rate, set `clip_grad_norm` (e.g. 1.0), train "
        "in bf16 or fp32 instead of fp16, and check the data for empty or fully masked samples."
    )
    assert _printed_by_tune(f"ERROR:tune.recipes.x: {message}")
    assert _printed_by_tune(message.replace("(the last saved checkpoint is intact)", "(...)"))
    assert not _printed_by_tune(message.replace("so no checkpoint", "so the checkpoint"))  # a word changed
    assert not _printed_by_tune(message.replace(" Common fixes:", " Fixes:"))
    assert not _printed_by_tune(message.split(";")[0])  # cut short without "..."
