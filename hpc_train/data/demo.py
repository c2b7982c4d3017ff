"""Text that needs no internet: English sentences from the docstrings of Python's own standard
library, as a small corpus (``demo``) or laid out like wikitext-103-raw (tests, benchmark)."""

from __future__ import annotations

import ast
import random
import re
import sysconfig
from collections.abc import Iterator, Sequence
from pathlib import Path


def _docstring_sentences(source: str) -> Iterator[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if not doc:
                continue
            for paragraph in re.split(r"\n\s*\n", doc):
                text = " ".join(paragraph.split())
                # prose only: skip code samples, tables and parameter lists
                if len(text) < 40 or re.search(r">>>|[=\-]{4}|^\W", text):
                    continue
                yield from (s for s in re.split(r"(?<=[.!?])\s+", text) if len(s.split()) >= 5)


def demo_corpus(lines: int) -> list[str]:
    """Up to ``lines`` English sentences from the docstrings of Python's own standard library.

    Deterministic for a given Python version; read as text with ``ast`` (nothing is imported).
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out: list[str] = []
    seen: set[str] = set()
    for path in sorted(stdlib.glob("*.py")) + sorted(stdlib.glob("*/*.py")):
        if "test" in path.parts or "idlelib" in path.parts:
            continue
        for sentence in _docstring_sentences(path.read_text(encoding="utf-8", errors="replace")):
            if sentence not in seen and len(sentence) <= 240:
                seen.add(sentence)
                out.append(sentence)
                if len(out) >= lines:
                    return out
    return out


def wikitext_layout(sentences: Sequence[str], articles: int, seed: int = 0) -> str:
    """``articles`` made-up articles in wikitext-103-raw's layout: ``" = Title = "`` and
    ``" = = Section = = "`` headings, paragraphs of a few sentences, blank lines (``" "``)
    between them, every line starting with a space."""
    rnd = random.Random(seed)

    def words(n: int) -> str:
        return " ".join(rnd.choice(sentences).split()[:n])

    lines: list[str] = []
    for _ in range(articles):
        lines += [" ", f" = {words(3)} = ", " "]
        for section in range(rnd.randint(1, 3)):
            if section:
                lines += [f" = = {words(2)} = = ", " "]
            for _ in range(rnd.randint(1, 4)):
                lines += [" " + " ".join(rnd.sample(sentences, rnd.randint(2, 6))) + " ", " "]
    return "\n".join(lines) + "\n"
