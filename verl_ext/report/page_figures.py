"""Figures with no source: every measured figure a page shows outside the generator's markers.

A page (:data:`PAGES`) may show a figure (a ratio ``2.5x``/``3.2×``, a percentage ``80%``, a size ``721 MB``/``24 GiB``,
a time ``10.8 min``/``3.15 s``/``139.5 ms``/``2 hours``, a decimal ``0.312``/``46.23``/``1.9e-7``) only where
:mod:`verl_ext.report.doc_numbers` writes it: inside an inline marker ``<!--=... -->value<!--/-->`` or a
``<!-- generated: ... -->`` block, both filled from a recorded artifact under ``benchmarks/results/`` (a sweep's runs, a
benchmark's JSON with its command, machine and date, the papers' reported tables). :func:`unsourced` finds the
others, whatever their format; ``python -m verl_ext.report.doc_numbers`` (the one check,
:func:`verl_ext.report.doc_numbers.check`) reports each as ``file:line: figure``.

Not figures, by rule (:data:`EXEMPT` and the masks of :func:`masked`):

* code: fenced blocks and inline code (a setting is written as code: ```poll_interval_s=2.0```), LaTeX maths
  ``$...$`` / ``$$...$$``, HTML comments, link targets and bare URLs;
* names: a number glued to a letter, ``-``, ``_`` or ``/`` (``Qwen2.5-VL-7B``, ``gsm8k``, ``fp8``, ``H100``);
* versions and identifiers: dotted triples (``0.9.1``), a decimal after ``Python``/``verl``/``vLLM``/``torch``/... or
  ``v`` (``Python 3.11``, ``v0.4``), arXiv ids (``2505.12345``, ``arXiv:2505.12345v2``), section and equation numbers
  after ``§``, ``Section``, ``Eq.``, ``Table``, ``Figure``, ``Algorithm`` (each a whole word).

Plain integers (24 steps, 3 seeds) are counts a reader checks against the configs, not measurements; they are not
scanned.
"""

from __future__ import annotations

import re
from pathlib import Path

# The pages a reader reads; the lab notebooks (benchmarks/results/*/NOTES.md) keep doc_numbers' narrower guard.
PAGES = ("README.md", "recipe/diva_grpo/README.md", "docs/**/*.md")
# The generator's markers (verl_ext.report.doc_numbers): a generated block, and an inline figure.
BLOCK = re.compile(
    r"^(?P<open><!-- generated: (?P<spec>[^\n]*?) -->)\n(?P<body>.*?)^(?P<close><!-- /generated -->)$",
    re.MULTILINE | re.DOTALL,
)
INLINE = re.compile(r"<!--=(?P<expr>[^>]*?)-->(?P<value>[^<\n]*)<!--/-->")

_NUMBER = r"\d+(?:[.,]\d+)*"
_SIZE_UNITS = r"(?:[KMGTP]i?B|bytes?|[KMGT]B/s)"
_TIME_UNITS = r"(?:ms|µs|us|ns|s|sec|secs|seconds?|min|mins|minutes?|h|hrs?|hours?|days?)"
FIGURE = re.compile(
    r"(?<![\w./\\-])"  # not glued to a name, a path or another number
    r"(?:[+±~≈−-] ?)?"
    rf"(?P<figure>{_NUMBER}(?: ?(?:-|–|to) ?{_NUMBER})?"
    r"(?:"
    r" ?[x×](?![\w])(?! ?\d)"  # a ratio (not a shape: 2,560 x 4,096)
    r"| ?%"  # a percentage
    rf"|[ -]?{_SIZE_UNITS}(?![\w])"  # a size
    rf"|[ -]?{_TIME_UNITS}(?![\w])"  # a time
    r"))"
)
DECIMAL = re.compile(r"(?<![\w./\\-])\d+(?:\.\d+(?:e[+-]?\d+)?|e[+-]?\d+)(?![\w.])")  # 0.312, 46.23, 1.9e-7

# Explicit exemptions, each a pattern of the text just before the figure (the figure's own words are not enough):
EXEMPT = {
    "a version": re.compile(
        r"(?<![\w-])(?:Python|python|verl|vLLM|vllm|torch|PyTorch|CUDA|cuda|Ray|ray|transformers|flash-attn|numpy|NumPy|"
        r"pydantic|ruff|pytest|Qwen|version|release|v)\s?$"
    ),
    "a section, equation, table or figure number": re.compile(
        r"(?:§|(?<![\w-])(?:Section|section|Sec\.|Eq\.|eq\.|Equation|equation|Table|table|Figure|figure|Fig\.|Algorithm|"
        r"Appendix|appendix|Theorem|Lemma|Definition|Proposition|Remark))\s?\(?$"
    ),
    "an arXiv id": re.compile(r"(?<![\w-])(?:arXiv|arxiv)[:\s]?$"),
}
ARXIV_ID = re.compile(r"(?<![\w.])\d{4}\.\d{4,5}(?:v\d+)?(?![\w.])")
VERSION = re.compile(r"(?<![\w.])v?\d+\.\d+\.\d+(?:\.\d+)*(?![\w])")

_FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$", re.MULTILINE | re.DOTALL)
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_CODE = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.DOTALL)
_MATH = re.compile(r"\$\$.+?\$\$|(?<![\\$])\$(?!\s)[^$\n]+?(?<![\s\\])\$(?!\d)", re.DOTALL)
_LINK_TARGET = re.compile(r"\]\([^)\s]*\)|\]\[[^\]]*\]|^\s*\[[^\]]+\]:\s*\S+", re.MULTILINE)
_URL = re.compile(r"https?://\S+|<[a-z]+://[^>]+>")


def _blank(match: re.Match) -> str:
    """The match as spaces, its newlines kept (line numbers and columns stay those of the page)."""
    return re.sub(r"[^\n]", " ", match.group())


def masked(text: str) -> str:
    """``text`` with everything that is not prose blanked: generated regions, code, maths, comments, links."""
    for pattern in (_FENCE, BLOCK, INLINE, _COMMENT, _CODE, _MATH, _LINK_TARGET, _URL, ARXIV_ID, VERSION):
        text = pattern.sub(_blank, text)
    return text


def _exempt(prose: str, start: int) -> bool:
    before = prose[max(0, start - 40) : start]
    return any(pattern.search(before) for pattern in EXEMPT.values())


def unsourced(text: str) -> list[tuple[int, str]]:
    """``(line, figure)`` of each figure in ``text`` that no generator marker wrote, in page order."""
    prose = masked(text)
    found: dict[int, tuple[int, str]] = {}
    spans: list[tuple[int, int]] = []  # a figure with a unit is found once, not again as a bare decimal
    for pattern in (FIGURE, DECIMAL):
        for match in pattern.finditer(prose):
            start = match.start("figure") if "figure" in pattern.groupindex else match.start()
            figure = (match.group("figure") if "figure" in pattern.groupindex else match.group()).strip()
            end = start + len(figure)
            if not figure or _exempt(prose, start) or any(start < e and s < end for s, e in spans):
                continue
            if figure.replace(",", "").isdigit():  # a plain integer: a count, not a measurement
                continue
            found[start] = (prose.count("\n", 0, start) + 1, figure)
            spans.append((start, end))
    return [found[s] for s in sorted(found)]


def pages(root: Path) -> list[Path]:
    """Every page :func:`unsourced` scans under ``root``."""
    root = Path(root)
    return sorted({p for pattern in PAGES for p in root.glob(pattern) if p.is_file()})
