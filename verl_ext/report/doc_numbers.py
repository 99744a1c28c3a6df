"""Every figure in the docs, generated from a recorded artifact: ``python -m verl_ext.report.doc_numbers --write``.

One command regenerates every figure of every page (``--write``), and the same command without ``--write`` is the one
check (CI: ``tests/docs/test_doc_numbers_on_cpu.py``): a figure that differs from its record, and any figure of any
format (``2.5x``, ``80%``, ``721 MB``, ``10.8 min``, ``0.312``) that a page shows outside a marker
(:mod:`verl_ext.report.page_figures`: what counts as a figure, what does not), fails it naming file, line and figure.

The records, all under ``benchmarks/results/``: the seed sweeps' runs; each benchmark's JSON
(``benchmarks/<script>.py`` saves ``<name>/<name>.json`` with its command, machine and date through
``benchmarks/record.py``); the papers' own reported tables (``papers/papers.json``, each figure with the paper and
table it is copied from), the only figures not measured here.

Why markers of our own and not cogapp's ``cog --check``: most figures sit inside a sentence or a table cell, and a
cog block is whole lines (it would break the Markdown paragraph or table it sits in); tables are generated too, and
two syntaxes for one job would mean two commands and two checks. The markers below are two regular expressions,
hidden by Markdown (HTML comments), and evaluate no code from the page.

The seed sweeps' recorded runs (``benchmarks/results/<folder>/<config>/seed<k>/``, :mod:`verl_ext.lab.sweep`) are
the project's evidence; a page quotes them only through markers that this module fills from the runs, so that a
number cannot drift from the run it reads. Two kinds of marker, in any Markdown file:

Blocks, a whole table between two comment lines::

    <!-- generated: sweep-table third24 -->
    ... (replaced) ...
    <!-- /generated -->

``sweep-table FOLDER [configs=a,b]`` is the sweep's own table (:func:`verl_ext.lab.sweep_table.table_markdown`);
``sweep-curves FOLDER configs=a,b seeds=0,1 [view=greedy]`` the validation at every validated step, one row per
configuration and seed, each row's best in bold; ``sweep-seeds FOLDER [configs=a,b]`` each seed's best sampled
accuracy and its difference from GRPO at that seed. ``cpu-ledger`` (docs/stack.md) is the table of
:func:`verl_ext.checks.ledger.ledger_markdown`, every config difference between a GPU launcher and its CPU run.

Inline figures, one number in prose::

    NC-GRPO ends <!--=third24 noise_contrastive_grpo paired-->+0.061<!--/--> from GRPO

The expression is ``FOLDER TARGET QUANTITY [FORMAT]``. ``FOLDER`` is an alias of :data:`FOLDERS` or a folder name
under ``benchmarks/results``. ``TARGET`` is a configuration (the table's figure over seeds: ``QUANTITY`` takes
``.mean`` (default), ``.min``, ``.max`` or ``.n``), ``CONFIG/seedK`` (one run), or ``*`` (the folder). Quantities:

==========================  ============================================================================
``best``, ``final``         best and last sampled validation accuracy
``greedy_best``, ``greedy_final``  the same, greedy
``paired``, ``final_paired``  best (last) sampled accuracy minus GRPO's at the same seed
``zero``                    mean zero-advantage fraction over the training steps
``responses``, ``minutes``  responses trained on; the run's minutes
``val@S``, ``greedy@S``     (a run) sampled / greedy validation at step S
``best_step``               (a run) the first step at its best sampled accuracy
``reach``                   (a run) the first step at GRPO's best of the same seed, ``never`` if none
``metric:KEY:AGG[:A-B]``    (a run) ``mean``, ``min``, ``max``, ``sum`` or ``at`` of a logged metric over steps
                            A to B (default: every step that logged it); ``zeros`` counts the steps at 0
``diverge:OTHER:KEY``       (a run) the first step where metric KEY differs from the same run in sweep OTHER
                            (the same start, another length), ``none`` if it never does
``original_zero``, ``solved``  (the sparse task) the originals' zero-advantage fraction; the share of the
                            warm start's unsolved validation questions the final policy solves
``unsolved_gain``           (the sparse task) the change of those questions' right-answer log-probability
                            from the warm start to the final policy
``questions:PATH``          (the sparse task) a figure of a run's ``questions.json``
                            (:func:`verl_ext.lab.solved_questions.solved_record`), ``PATH`` as in ``property:PATH``:
                            ``unsolved_right_log_prob_parts.end.colour``; of a configuration, its mean over seeds
``runs``                    (``*``) the runs that finished (``done.json``)
``record:PATH``             (``*``) a figure of the folder's record ``FOLDER/FOLDER.json`` (a benchmark's, the
                            papers'), ``PATH`` as in ``property:PATH``: ``test_tiers * record:launch.minutes``;
                            written as recorded unless ``FORMAT`` says otherwise
``property:PATH``           (``*``) a figure of the folder's ``properties.json`` (the sparse task's warm start,
                            :func:`verl_ext.lab.sparse_task.task_properties`), ``PATH`` dotted, a list's item by
                            its index: ``unsolved.share``, ``hints_transfer.trajectory.-1.log_prob``
``common:OTHER``            (``*``) the runs (configuration and seed) that sweep OTHER also holds
``repeats:OTHER``           (``*``) how many of those log OTHER's values again over the steps both ran
                            (validation, training score, gradient norm)
``calc:EXPR``               (``TARGET`` and ``FOLDER`` as ``-``) arithmetic on numbers: ``calc:sqrt(0.25/256)``
==========================  ============================================================================

``FORMAT`` (``%.2f``, ``%+.3f``, ``%d``, ``%pct``: a share as a whole percentage, ``%x100``: a ratio as a
percentage change, ``1.04`` as ``+4``; a divisor after ``/`` scales first: ``%.0f/1e6`` writes bytes as MB)
defaults to ``%.3f`` for
accuracies, ``%+.3f`` for paired differences (a difference that rounds to 0 is written ``0.000``), ``%d`` for steps
and counts and ``%.2f`` for metrics. Each figure is rounded once, where it prints, as the sweep's table does.

:func:`check` regenerates every page in memory and reports each figure that differs from its record, and each
figure that no marker produced (:func:`verl_ext.report.page_figures.unsourced`; in the sweeps' lab notebooks,
:data:`GUARDED`, each accuracy-like figure: ``0.123`` with three decimals): such a figure was typed by hand.
"""

from __future__ import annotations

import argparse
import ast
import math
import operator
import re
import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from verl_ext.report.page_figures import BLOCK, INLINE, pages

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path("benchmarks/results")

# Short names for the recorded sweeps, one per warm start and protocol (docs/learning.md, "Which runs pair").
FOLDERS = {
    "first": "sweep_tiny",
    "first48": "sweep_tiny_48",
    "second": "sweep_tiny_second_start",
    "second24": "sweep_tiny_second_start_24",
    "third24": "sweep_tiny_third_start_24",
    "nc12": "sweep_tiny_nc_12",
    "sparse": "sweep_sparse",
}

# The sweeps' lab notebooks, where every three-decimal figure must come from a marker; the pages
# (verl_ext.report.page_figures.PAGES) are scanned for figures of every format.
GUARDED = ("benchmarks/results/*/NOTES.md",)

ACCURACY_LIKE = re.compile(r"(?<![\w.])[+-]?\d\.\d{3}(?![\d])")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)

TABLE_FIELDS = {
    "best": "best_sampled",
    "final": "final_sampled",
    "greedy_best": "best_greedy",
    "greedy_final": "final_greedy",
    "paired": "best_sampled_minus_grpo",
    "final_paired": "final_sampled_minus_grpo",
    "zero": "zero_advantage_fraction",
    "responses": "responses",
    "minutes": "minutes",
    # The sparse task's (verl_ext.lab.sweep_table.SPARSE_COLUMNS): the originals' own zero-advantage fraction, the
    # share of the validation questions unsolved at the warm start that the final policy solves, and how far it moved
    # their right answer's log-probability.
    "original_zero": "original_zero_advantage_fraction",
    "solved": "unsolved_solved_share",
    "unsolved_gain": "unsolved_log_prob_change",
}
SIGNED = {"paired", "final_paired"}
COUNTS = {"responses", "best_step", "reach", "runs"}


class DocNumbersError(ValueError):
    """A marker that cannot be evaluated; the message names the file, line and expression."""


@dataclass
class Sweep:
    """One recorded sweep folder, tabulated once (:func:`verl_ext.lab.sweep_table.summarise`)."""

    folder: Path
    logs: dict = field(default_factory=dict)

    @cached_property
    def configs(self) -> list[str]:
        from verl_ext.lab.sweep_configs import CONFIGS

        # Configurations with a finished run (a sweep in progress leaves folders without done.json).
        return [c for c in CONFIGS if any((self.folder / c).glob("seed*/done.json"))]

    @cached_property
    def seeds(self) -> list[int]:
        found = {int(p.parent.name[4:]) for p in self.folder.glob("*/seed*/done.json") if p.parent.name[4:].isdigit()}
        return sorted(found)

    @cached_property
    def summary(self) -> dict:
        from verl_ext.lab.sweep_table import summarise

        if not self.configs:
            raise DocNumbersError(f"{self.folder}: no recorded runs (expected <config>/seed<k>/done.json)")
        return summarise(self.folder, self.configs, self.seeds)

    def run(self, config: str, seed: int) -> dict:
        try:
            return self.summary["runs"][config][seed]
        except KeyError:
            raise DocNumbersError(f"{self.folder}: no finished run {config}/seed{seed}") from None

    def log(self, config: str, seed: int):
        if (config, seed) not in self.logs:
            from verl_ext.report.run import load_run

            self.logs[(config, seed)] = load_run(self.folder / config / f"seed{seed}").log
        return self.logs[(config, seed)]

    def row(self, config: str) -> dict:
        try:
            return self.summary["table"][config]
        except KeyError:
            raise DocNumbersError(f"{self.folder}: no configuration {config!r} (has {self.configs})") from None


class Generator:
    """Evaluates markers against the recorded runs under ``root``; each sweep folder is read once."""

    def __init__(self, root: Path = REPO_ROOT):
        self.root = Path(root)
        self._sweeps: dict[str, Sweep] = {}

    def sweep(self, name: str) -> Sweep:
        folder = self.root / RESULTS / FOLDERS.get(name, name)
        if not folder.is_dir():
            raise DocNumbersError(f"no record {name!r} ({folder}); the sweeps' aliases: {FOLDERS}")
        key = str(folder)
        if key not in self._sweeps:
            self._sweeps[key] = Sweep(folder)
        return self._sweeps[key]

    # ---- inline figures -------------------------------------------------------------------------------------------

    def figure(self, expr: str) -> str:
        parts = expr.split()
        if len(parts) not in (3, 4):
            raise DocNumbersError(f"expected 'FOLDER TARGET QUANTITY [FORMAT]', got {expr!r}")
        folder, target, quantity = parts[:3]
        fmt = parts[3] if len(parts) == 4 else None
        if quantity.startswith("calc:"):
            return _format(_calc(quantity[5:]), fmt or "%.3f")
        sweep = self.sweep(folder)
        if target == "*":
            if quantity == "runs":
                return _format(len(list(sweep.folder.glob("*/seed*/done.json"))), fmt or "%d")
            if quantity.startswith(("repeats:", "common:")):
                what, other = quantity.split(":")
                pairs = self._common_runs(sweep, self.sweep(other))
                if what == "common":
                    return _format(len(pairs), fmt or "%d")
                return _format(sum(self._repeats(sweep, self.sweep(other), *p) for p in pairs), fmt or "%d")
            if quantity.startswith("property:"):
                path = quantity[len("property:") :]
                return _format(_json_figure(sweep.folder / "properties.json", path), fmt or "%.3f")
            if quantity.startswith("record:"):
                path = quantity[len("record:") :]
                return _format(_json_figure(sweep.folder / f"{sweep.folder.name}.json", path), fmt or "as recorded")
            raise DocNumbersError(
                f"{expr!r}: the folder ('*') has 'runs', 'repeats:OTHER', 'common:OTHER', 'property:PATH' and"
                " 'record:PATH'"
            )
        if "/seed" in target:
            config, seed = target.split("/seed")
            value, default = self._run_quantity(sweep, config, int(seed), quantity)
        elif quantity.startswith("questions:"):  # the mean over the configuration's seeds
            seeds = sorted(sweep.summary["runs"].get(target, {}))
            if not seeds:
                raise DocNumbersError(f"{sweep.folder.name}: no finished run of {target}")
            values = [self._run_quantity(sweep, target, int(seed), quantity)[0] for seed in seeds]
            value, default = sum(values) / len(values), "%.2f"
        else:
            value, default = self._table_quantity(sweep, target, quantity)
        return _format(value, fmt or default)

    def _table_quantity(self, sweep: Sweep, config: str, quantity: str):
        name, _, stat = quantity.partition(".")
        if name not in TABLE_FIELDS:
            raise DocNumbersError(f"unknown quantity {quantity!r} over seeds; known: {sorted(TABLE_FIELDS)}")
        stats = sweep.row(config).get(TABLE_FIELDS[name])
        if stats is None:
            raise DocNumbersError(f"{sweep.folder.name}: {config} has no {TABLE_FIELDS[name]} (no GRPO to pair?)")
        stat = stat or "mean"
        if stat not in ("mean", "min", "max", "n"):
            raise DocNumbersError(f"{quantity!r}: the statistic is one of mean, min, max, n")
        return stats[stat], _default_format(name if stat != "n" else "runs")

    def _run_quantity(self, sweep: Sweep, config: str, seed: int, quantity: str):
        run = sweep.run(config, seed)
        sampled, greedy = run["curves"]["sampled"], run["curves"]["greedy"]
        if quantity.startswith(("val@", "greedy@")):
            view, step = quantity.split("@")
            steps, values = sampled if view == "val" else greedy
            if int(step) not in steps:
                raise DocNumbersError(f"{config}/seed{seed} was not validated at step {step} (steps {steps})")
            return values[steps.index(int(step))], "%.3f"
        if quantity.startswith("metric:"):
            return self._metric(sweep, config, seed, quantity), "%.2f"
        if quantity.startswith("diverge:"):
            _, other, key = quantity.split(":", 2)
            return self._diverge(sweep, self.sweep(other), config, seed, key), "%d"
        base = sweep.summary["runs"].get("grpo", {}).get(seed)
        if quantity == "best":
            return max(sampled[1]), "%.3f"
        if quantity == "final":
            return sampled[1][-1], "%.3f"
        if quantity == "greedy_best":
            return max(greedy[1]), "%.3f"
        if quantity == "greedy_final":
            return greedy[1][-1], "%.3f"
        if quantity == "best_step":
            return sampled[0][sampled[1].index(max(sampled[1]))], "%d"
        if quantity == "zero":
            return run["zero_advantage_fraction"], "%.3f"
        if quantity.startswith("questions:"):
            return _json_figure(sweep.folder / config / f"seed{seed}" / "questions.json", quantity[10:]), "%.2f"
        if quantity in ("original_zero", "solved", "unsolved_gain"):
            if TABLE_FIELDS[quantity] not in run:
                raise DocNumbersError(f"{sweep.folder.name}: {config}/seed{seed} has no {TABLE_FIELDS[quantity]}")
            return run[TABLE_FIELDS[quantity]], _default_format(quantity)
        if quantity == "minutes":
            return run["minutes"], "%.1f"
        if quantity in ("paired", "final_paired", "reach"):
            if base is None:
                raise DocNumbersError(f"{sweep.folder.name}: no grpo/seed{seed} to pair {config}/seed{seed} with")
            if quantity == "paired":
                return max(sampled[1]) - max(base["curves"]["sampled"][1]), "%+.3f"
            if quantity == "final_paired":
                return sampled[1][-1] - base["curves"]["sampled"][1][-1], "%+.3f"
            target = max(base["curves"]["sampled"][1])
            reached = [s for s, v in zip(*sampled, strict=True) if v >= target - 1e-9]
            return (reached[0] if reached else "never"), "%d"
        raise DocNumbersError(f"unknown quantity {quantity!r} of a run (see verl_ext/report/doc_numbers.py)")

    def _metric(self, sweep: Sweep, config: str, seed: int, quantity: str) -> float:
        import numpy as np

        from verl_ext.report.series import series

        parts = quantity.split(":")
        if len(parts) not in (3, 4):
            raise DocNumbersError(f"{quantity!r}: expected metric:KEY:AGG[:A-B]")
        key, agg = parts[1], parts[2]
        steps, values = series(sweep.log(config, seed), key)
        if len(parts) == 4:
            low, _, high = parts[3].partition("-")
            keep = (steps >= int(low)) & (steps <= int(high or low))
            steps, values = steps[keep], values[keep]
        if not len(values):
            raise DocNumbersError(f"{config}/seed{seed}: no {key!r} logged at the steps asked ({quantity!r})")
        aggregates = {
            "mean": np.mean,
            "min": np.min,
            "max": np.max,
            "sum": np.sum,
            "zeros": lambda v: int(np.sum(v == 0)),
            "at": lambda v: _single(v, quantity),
        }
        if agg not in aggregates:
            raise DocNumbersError(f"{quantity!r}: the aggregate is one of {sorted(aggregates)}")
        return float(aggregates[agg](values))

    def _diverge(self, sweep: Sweep, other: Sweep, config: str, seed: int, key: str):
        """The first step at which ``key`` differs between the run and the same run of ``other`` (a run of another
        length from the same start), over the steps both logged; ``none`` when it never does."""
        from verl_ext.report.series import series

        mine = dict(zip(*series(sweep.log(config, seed), key), strict=True))
        theirs = dict(zip(*series(other.log(config, seed), key), strict=True))
        differ = sorted(step for step in set(mine) & set(theirs) if mine[step] != theirs[step])
        return int(differ[0]) if differ else "none"

    def _common_runs(self, sweep: Sweep, other: Sweep) -> list[tuple[str, int]]:
        both = _finished_runs(sweep) & _finished_runs(other)
        return [(c, s) for c in sweep.configs for s in sweep.seeds if (c, s) in both]

    def _repeats(self, sweep: Sweep, other: Sweep, config: str, seed: int) -> bool:
        """Whether the run logs the same run of ``other`` again, value for value, over the steps both ran: the
        validation (sampled and greedy), the training score and the gradient norm."""
        for view in ("sampled", "greedy"):
            mine = dict(zip(*sweep.run(config, seed)["curves"][view], strict=True))
            theirs = dict(zip(*other.run(config, seed)["curves"][view], strict=True))
            if any(mine[s] != theirs[s] for s in set(mine) & set(theirs)):
                return False
        return all(
            self._diverge(sweep, other, config, seed, key) == "none" for key in ("critic/score/mean", "actor/grad_norm")
        )

    # ---- blocks ---------------------------------------------------------------------------------------------------

    def block(self, spec: str) -> str:
        kind, *args = spec.split()
        if kind == "cpu-ledger":  # not a sweep: the config ledger of docs/stack.md (verl_ext/checks/ledger.py)
            from verl_ext.checks.ledger import ledger_markdown

            return ledger_markdown()
        if not args:
            raise DocNumbersError(f"block {spec!r}: expected '<kind> FOLDER [key=value ...]'")
        sweep = self.sweep(args[0])
        options = dict(_option(a, spec) for a in args[1:])
        configs = options.get("configs", ",".join(sweep.configs)).split(",")
        for config in configs:
            sweep.row(config)
        if kind == "sweep-table":
            from verl_ext.lab.sweep_table import table_markdown

            return "\n".join(table_markdown({c: sweep.row(c) for c in configs}))
        if kind == "sweep-curves":
            seeds = [int(s) for s in options.get("seeds", ",".join(map(str, sweep.seeds))).split(",")]
            return "\n".join(self._curves(sweep, configs, seeds, options.get("view", "sampled")))
        if kind == "sweep-seeds":
            return "\n".join(self._seeds(sweep, configs))
        raise DocNumbersError(f"unknown block kind {kind!r}: sweep-table, sweep-curves or sweep-seeds")

    def _curves(self, sweep: Sweep, configs: list[str], seeds: list[int], view: str) -> list[str]:
        rows = [(c, s, sweep.run(c, s)["curves"][view]) for c in configs for s in seeds]
        steps = sorted({step for _, _, (st, _) in rows for step in st})
        lines = ["| | " + " | ".join(map(str, steps)) + " |", "|---" * (len(steps) + 1) + "|"]
        for config, seed, (st, values) in rows:
            best = max(values)
            by_step = dict(zip(st, values, strict=True))
            cells = []
            for step in steps:
                value = by_step.get(step)
                text = "-" if value is None else f"{value:.3f}"
                marked = value is not None and value == best and step == st[values.index(best)]
                cells.append(f"**{text}**" if marked else text)
            lines.append(f"| `{config}`, seed {seed} | " + " | ".join(cells) + " |")
        return lines

    def _seeds(self, sweep: Sweep, configs: list[str]) -> list[str]:
        seeds = sweep.seeds
        lines = ["| configuration | " + " | ".join(f"seed {s}: best (- GRPO)" for s in seeds) + " |"]
        lines.append("|---" * (len(seeds) + 1) + "|")
        for config in configs:
            cells = []
            for seed in seeds:
                if seed not in sweep.summary["runs"].get(config, {}):
                    cells.append("-")
                    continue
                best, _ = self._run_quantity(sweep, config, seed, "best")
                if config == "grpo" or seed not in sweep.summary["runs"].get("grpo", {}):
                    cells.append(_format(best, "%.3f"))
                else:
                    paired, _ = self._run_quantity(sweep, config, seed, "paired")
                    cells.append(f"{_format(best, '%.3f')} ({_format(paired, '%+.3f')})")
            lines.append(f"| `{config}` | " + " | ".join(cells) + " |")
        return lines

    # ---- files ----------------------------------------------------------------------------------------------------

    def render(self, text: str, where: str = "<text>") -> str:
        """``text`` with every marker's content regenerated."""

        def fill_block(match: re.Match) -> str:
            try:
                body = self.block(match["spec"])
            except DocNumbersError as error:
                raise DocNumbersError(f"{where}:{_line(text, match.start())}: {error}") from None
            return f"{match['open']}\n{body}\n{match['close']}"

        def fill_inline(match: re.Match) -> str:
            try:
                value = self.figure(match["expr"].strip())
            except DocNumbersError as error:
                raise DocNumbersError(f"{where}:{_line(text, match.start())}: {error}") from None
            return f"<!--={match['expr']}-->{value}<!--/-->"

        return INLINE.sub(fill_inline, BLOCK.sub(fill_block, text))


def _finished_runs(sweep: Sweep) -> set[tuple[str, int]]:
    return {(p.parent.parent.name, int(p.parent.name[4:])) for p in sweep.folder.glob("*/seed*/done.json")}


def _option(arg: str, spec: str) -> tuple[str, str]:
    key, sep, value = arg.partition("=")
    if not sep or key not in ("configs", "seeds", "view"):
        raise DocNumbersError(f"block {spec!r}: {arg!r} is not configs=..., seeds=... or view=...")
    return key, value


def _single(values, quantity: str) -> float:
    if len(values) != 1:
        raise DocNumbersError(f"{quantity!r}: 'at' needs one step (A or A-A), got {len(values)}")
    return values[0]


def _json_figure(file: Path, path: str):
    """The figure at dotted ``path`` in the JSON ``file`` (a sweep folder's ``properties.json``, a run's
    ``questions.json``, a benchmark's record ``<name>/<name>.json``)."""
    import json

    if not file.exists():
        raise DocNumbersError(f"{file.parent.name}: no {file.name}")
    value = json.loads(file.read_text())
    for key in path.split("."):
        if isinstance(value, list) and key.lstrip("-").isdigit() and -len(value) <= int(key) < len(value):
            value = value[int(key)]  # a list's item by its index: hints_transfer.trajectory.-1.log_prob
        elif isinstance(value, dict) and key in value:
            value = value[key]
        else:
            raise DocNumbersError(f"{file}: no {path!r} (stopped at {key!r})")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DocNumbersError(f"{file}: {path!r} is {value!r}, not a number")
    return value


def _default_format(name: str) -> str:
    if name in SIGNED:
        return "%+.3f"
    if name in COUNTS:
        return "%d"
    if name == "minutes":
        return "%.1f"
    if name == "unsolved_gain":  # a log-probability: two decimals, signed
        return "%+.2f"
    return "%.3f"


def _format(value, fmt: str) -> str:
    if isinstance(value, str):
        return value
    if "/" in fmt:  # scaled first: "%.0f/1e6" writes bytes as MB
        fmt, divisor = fmt.split("/", 1)
        value = value / float(divisor)
    if fmt == "as recorded":  # the JSON's own digits: a benchmark rounds its figures where it records them
        return str(value)
    if fmt == "%x100":  # a ratio as a percentage change: 1.04 -> +4
        return f"{round((value - 1) * 100):+d}"
    if fmt == "%pct":
        return f"{round(value * 100)}%"
    if fmt == "%d":
        return str(round(value))
    text = fmt % value
    if fmt.startswith("%+") and float(text) == 0:
        return text[1:].replace("-", "")  # a difference that rounds to 0 is written 0.000, not +0.000 or -0.000
    return text


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _calc(expr: str) -> float:
    """Arithmetic on literal numbers (``+ - * /``, ``sqrt``): constants a page derives, such as a grid's step."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "sqrt":
            return math.sqrt(value(node.args[0]))
        raise DocNumbersError(f"calc:{expr}: only numbers, + - * / and sqrt()")

    try:
        return value(ast.parse(expr, mode="eval").body)
    except SyntaxError:
        raise DocNumbersError(f"calc:{expr}: not arithmetic") from None


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def marked_files(root: Path = REPO_ROOT) -> list[Path]:
    """The Markdown files the generator writes and the check reads: every page
    (:data:`verl_ext.report.page_figures.PAGES`), every :data:`GUARDED` notebook, any other file with a marker."""
    root = Path(root)
    found = set(pages(root))
    for pattern in GUARDED:
        found.update(root.glob(pattern))
    for path in [root / "README.md", *root.glob("docs/**/*.md"), *root.glob("benchmarks/**/*.md")]:
        if path.is_file() and ("<!-- generated: " in (text := path.read_text()) or "<!--=" in text):
            found.add(path)
    return sorted(found)


def hand_typed(text: str) -> list[tuple[int, str]]:
    """``(line, figure)`` of each accuracy-like figure in ``text`` outside markers and code blocks."""
    masked = FENCE.sub(lambda m: "\n" * m.group().count("\n"), text)
    masked = BLOCK.sub(lambda m: "\n" * m.group().count("\n"), masked)
    masked = INLINE.sub("", masked)
    return [(_line(masked, m.start()), m.group()) for m in ACCURACY_LIKE.finditer(masked)]


def check(root: Path = REPO_ROOT, files: list[Path] | None = None) -> list[str]:
    """Every difference between the pages and their regeneration, and every figure typed by hand (a page's of any
    format, a lab notebook's accuracy-like): one message each, naming the file and line (empty: every figure is its
    record's). ``files``: only those, each scanned as a page unless it is a ``NOTES.md`` notebook."""
    from verl_ext.report.page_figures import unsourced

    root = Path(root)
    generator = Generator(root)
    problems = _recorded_problems(root, generator) if files is None else []
    for path in files if files is not None else marked_files(root):
        where = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
        text = path.read_text()
        try:
            fresh = generator.render(text, where)
        except DocNumbersError as error:
            problems.append(str(error))
            continue
        old_lines, new_lines = text.splitlines(), fresh.splitlines()
        for number, (old, new) in enumerate(zip(old_lines, new_lines, strict=False), start=1):
            if old != new:
                problems.append(f"{where}:{number}: the runs give\n    {new}\n  the page has\n    {old}")
        if len(old_lines) != len(new_lines):
            problems.append(f"{where}: a generated block's length changed; run --write")
            continue
        for number, figure in hand_typed(text) if path.name == "NOTES.md" else unsourced(text):
            problems.append(
                f"{where}:{number}: {figure} is typed by hand; quote it from its record with a marker"
                " (verl_ext/report/doc_numbers.py) or drop it"
            )
    return problems


def recorded_tables(root: Path = REPO_ROOT, generator: Generator | None = None) -> dict[Path, str]:
    """``{path: text}``: each recorded sweep's ``sweep.md`` and ``sweep.json`` as its runs give them (the sweep writes
    both when it ends; a table code change or a later run leaves them stale). The configurations keep the order of
    the folder's ``sweep.json`` (the order they ran in)."""
    import json

    from verl_ext.lab.sweep_table import table_markdown

    generator = generator or Generator(root)
    texts = {}
    for table_json in sorted((Path(root) / RESULTS).glob("*/sweep.json")):
        sweep = generator.sweep(table_json.parent.name)
        recorded = json.loads(table_json.read_text())
        order = [c for c in recorded.get("table", {}) if c in sweep.configs]
        order += [c for c in sweep.configs if c not in order]
        table = {c: sweep.row(c) for c in order}
        texts[table_json.with_name("sweep.md")] = "\n".join(table_markdown(table)) + "\n"
        fresh = {**recorded, "runs": {c: sweep.summary["runs"][c] for c in order}, "table": table}
        texts[table_json] = json.dumps(fresh, indent=1)
    return texts


def _figures_only(summary: dict) -> dict:
    """A sweep's JSON without the configurations' notes (words of ``CONFIGS``, not figures of the runs)."""
    table = {c: {k: v for k, v in row.items() if k != "note"} for c, row in summary.get("table", {}).items()}
    return {**summary, "table": table}


def _recorded_problems(root: Path, generator: Generator) -> list[str]:
    import json

    problems = []
    for path, fresh in recorded_tables(root, generator).items():
        where = path.relative_to(root)
        if path.suffix == ".json":
            if _figures_only(json.loads(path.read_text())) != _figures_only(json.loads(fresh)):
                problems.append(f"{where}: its table differs from its runs' figures; run --write")
        elif path.read_text() != fresh:
            problems.append(f"{where}: differs from its runs' table; run --write")
    return problems


def write(root: Path = REPO_ROOT) -> list[Path]:
    """Regenerate every marked file and each recorded sweep's table in place; returns those that changed."""
    generator = Generator(root)
    changed = []
    for path, fresh in recorded_tables(root, generator).items():
        if path.read_text() != fresh:
            path.write_text(fresh)
            changed.append(path)
    for path in marked_files(root):
        text = path.read_text()
        fresh = generator.render(text, str(path))
        if fresh != text:
            path.write_text(fresh)
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="regenerate the marked files in place")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="the repository (default: this checkout)")
    args = parser.parse_args(argv)
    if args.write:
        for path in write(args.root):
            print(f"regenerated {path}")
    problems = check(args.root)
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"{len(marked_files(args.root))} files checked, {len(problems)} figures with no record or another value")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
