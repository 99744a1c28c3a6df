"""The docs' figures are the records' (``verl_ext/report/doc_numbers.py``): regenerated here, compared with the pages,
checked against a plain reading of the runs' metrics files; a figure of any format that no record gives fails the
check (``verl_ext/report/page_figures.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_ext.report import doc_numbers
from verl_ext.report.doc_numbers import DocNumbersError, Generator, check, hand_typed
from verl_ext.report.page_figures import pages, unsourced

ROOT = Path(__file__).resolve().parents[2]
THIRD = ROOT / "benchmarks/results/sweep_tiny_third_start_24"


@pytest.fixture(scope="module")
def generator():
    return Generator(ROOT)


def test_the_docs_figures_are_the_recorded_runs():
    problems = check(ROOT)
    assert not problems, "run `python -m verl_ext.report.doc_numbers --write`:\n" + "\n".join(problems)


def test_the_guarded_pages_have_markers():
    # The check would pass vacuously on pages without markers: the guarded pages quote the runs through them.
    for page in ("docs/learning.md", "README.md"):
        text = (ROOT / page).read_text()
        assert text.count("<!--=") >= 10, page
    assert "<!-- generated: sweep-table" in (ROOT / "docs/learning.md").read_text()


def _plain_validation(run: Path, view: str) -> dict[int, float]:
    """The run's validation accuracy by step, read straight from its JSONL (the slow, obvious reference)."""
    found = {}
    for path in sorted((run / "metrics").rglob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            for key, value in record["data"].items():
                if key.startswith("val-core/") and f"_{view}/" in key and "/mean@" in key:
                    found[record["step"]] = value
    return found


@pytest.mark.parametrize("config, seed", [("noise_contrastive_grpo", 0), ("diva_grpo", 1), ("grpo", 2)])
def test_figures_against_a_plain_reading_of_the_metrics(generator, config, seed):
    mine = _plain_validation(THIRD / config / f"seed{seed}", "sampled")
    grpo = _plain_validation(THIRD / "grpo" / f"seed{seed}", "sampled")
    greedy = _plain_validation(THIRD / config / f"seed{seed}", "greedy")
    assert generator.figure(f"third24 {config}/seed{seed} best") == f"{max(mine.values()):.3f}"
    assert generator.figure(f"third24 {config}/seed{seed} final") == f"{mine[max(mine)]:.3f}"
    assert generator.figure(f"third24 {config}/seed{seed} val@8") == f"{mine[8]:.3f}"
    assert generator.figure(f"third24 {config}/seed{seed} greedy@24") == f"{greedy[24]:.3f}"
    paired = max(mine.values()) - max(grpo.values())
    expected = "0.000" if round(paired, 3) == 0 else f"{paired:+.3f}"
    assert generator.figure(f"third24 {config}/seed{seed} paired") == expected


def test_a_configuration_figure_is_the_mean_over_seeds(generator):
    bests = [max(_plain_validation(THIRD / "diva_grpo" / f"seed{s}", "sampled").values()) for s in (0, 1, 2)]
    assert generator.figure("third24 diva_grpo best") == f"{sum(bests) / 3:.3f}"
    assert generator.figure("third24 diva_grpo best.min") == f"{min(bests):.3f}"
    assert generator.figure("third24 diva_grpo best.n") == "3"


def test_a_metric_figure_against_the_jsonl(generator):
    values = []
    for path in sorted((THIRD / "grpo/seed0/metrics").rglob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if 1 <= record["step"] <= 12 and "actor/grad_norm" in record["data"]:
                values.append(record["data"]["actor/grad_norm"])
    assert len(values) == 12
    assert generator.figure("third24 grpo/seed0 metric:actor/grad_norm:mean:1-12") == f"{sum(values) / 12:.2f}"


def test_counts_and_divergence(generator):
    finished = list((ROOT / "benchmarks/results/sweep_tiny").glob("*/seed*/done.json"))
    assert generator.figure("first * runs") == str(len(finished))
    # MUPO's 24-step runs log other gradient norms than its 12-step runs: its diversity weight follows the run's length
    assert generator.figure("second24 mupo/seed0 diverge:second:actor/grad_norm") != "none"
    assert generator.figure("second24 grpo/seed0 diverge:second:actor/grad_norm") == "none"


def test_a_hand_edited_figure_is_caught(tmp_path):
    page = (ROOT / "docs/learning.md").read_text()
    marker = "<!--=third24 noise_contrastive_grpo/seed0 paired-->"
    value = page.split(marker, 1)[1].split("<!--/-->", 1)[0]
    edited = tmp_path / "learning.md"
    edited.write_text(page.replace(f"{marker}{value}<!--/-->", f"{marker}+0.250<!--/-->", 1))
    problems = check(ROOT, files=[edited])
    assert len(problems) == 1 and "+0.250" in problems[0] and value in problems[0]


def test_a_hand_edited_table_cell_is_caught(tmp_path):
    page = (ROOT / "docs/learning.md").read_text()
    start = page.index("<!-- generated: sweep-table third24")
    row = page.index("| `noise_contrastive_grpo` |", start)
    end = page.index("\n", row)
    edited = tmp_path / "learning.md"
    edited.write_text(page[:row] + page[row:end].replace("| 0, 1, 2 |", "| 0, 1 |", 1) + page[end:])
    assert len(check(ROOT, files=[edited])) == 1


def test_a_figure_typed_by_hand_is_found():
    text = "GRPO ends at 0.703 <!--=first grpo best-->0.688<!--/-->.\n```\n0.123 in a code block\n```\n"
    assert hand_typed(text) == [(1, "0.703")]


def test_a_stale_sweep_table_is_caught(tmp_path):
    folder = tmp_path / "benchmarks/results/sweep_tiny_third_start_24"
    folder.parent.mkdir(parents=True)
    folder.symlink_to(THIRD, target_is_directory=True)
    generator = Generator(tmp_path)
    texts = doc_numbers.recorded_tables(tmp_path, generator)
    assert texts[folder / "sweep.md"] == (THIRD / "sweep.md").read_text()


@pytest.mark.parametrize(
    "expr, message",
    [
        ("third24 grpo/seed0 val@5", "not validated at step 5"),
        ("third24 nope best", "no configuration"),
        ("nowhere grpo best", "no record"),
        ("third24 grpo/seed0 metric:no/such/key:mean", "no 'no/such/key'"),
        ("- - calc:__import__('os')", "only numbers"),
        ("third24 grpo", "expected"),
    ],
)
def test_a_bad_marker_names_what_is_wrong(generator, expr, message):
    with pytest.raises(DocNumbersError, match=message):
        generator.figure(expr)


def test_formats():
    assert doc_numbers._format(-0.0004, "%+.3f") == "0.000"
    assert doc_numbers._format(-0.01953125, "%+.3f") == "-0.020"  # the 48-step figure once typed as -0.019
    assert doc_numbers._format(0.0196, "%+.3f") == "+0.020"  # rounded, never truncated
    assert doc_numbers._format(0.276, "%pct") == "28%"
    assert doc_numbers._format(28.0, "%d") == "28"
    assert doc_numbers._calc("sqrt(0.25/256)") == pytest.approx(0.03125)


def test_the_sparse_tasks_figures_against_its_recorded_files(generator):
    """The sparse task's sweep records, beside each run's metrics, the unsolved questions its final policy solves
    (``questions.json``), its learning-signal means (``signal.json``) and, for the folder, the warm start's three
    properties (``properties.json``): the markers read those files."""
    sparse = ROOT / "benchmarks/results/sweep_sparse"
    run = sparse / "diva_grpo" / "seed0"
    questions = json.loads((run / "questions.json").read_text())
    assert questions["solved_share"] == len(questions["solved"]) / len(questions["initially_unsolved"])
    assert generator.figure("sparse diva_grpo/seed0 solved") == f"{questions['solved_share']:.3f}"
    signal = json.loads((run / "signal.json").read_text())
    assert generator.figure("sparse diva_grpo/seed0 original_zero") == f"{1 - signal['original_signal']:.3f}"
    properties = json.loads((sparse / "properties.json").read_text())
    assert (
        generator.figure("sparse * property:unsolved.share %pct") == f"{round(properties['unsolved']['share'] * 100)}%"
    )
    last = properties["hints_transfer"]["trajectory"][-1]["log_prob"]
    assert generator.figure("sparse * property:hints_transfer.trajectory.-1.log_prob %.2f") == f"{last:.2f}"
    colour = questions["unsolved_right_log_prob_parts"]["end"]["colour"]
    assert generator.figure("sparse diva_grpo/seed0 questions:unsolved_right_log_prob_parts.end.colour") == (
        f"{colour:.2f}"
    )
    ends = [
        json.loads((sparse / "diva_grpo" / f"seed{k}" / "questions.json").read_text())["unsolved_right_log_prob"]["end"]
        for k in (0, 1, 2)
    ]
    assert generator.figure("sparse diva_grpo questions:unsolved_right_log_prob.end") == f"{sum(ends) / 3:.2f}"
    with pytest.raises(DocNumbersError, match="not a number"):
        generator.figure("sparse * property:unsolved.held")
    with pytest.raises(DocNumbersError, match="no properties.json"):
        generator.figure("third24 * property:unsolved.share")


def _with_a_line(page: str, tmp_path: Path, line: str) -> tuple[Path, int]:
    """A copy of ``page`` under ``tmp_path`` with ``line`` as a paragraph of its own after the title; its line."""
    text = (ROOT / page).read_text().splitlines(keepends=True)
    copy = tmp_path / page
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text("".join([text[0], "\n", line + "\n", *text[1:]]))
    return copy, 3


@pytest.mark.parametrize(
    "page, line, figure",
    [
        ("docs/reliability.md", "A resumed run reaches its step 2.5x sooner than a fresh one.", "2.5x"),
        ("docs/algo/diva_grpo.md", "The variants cut the zero-advantage groups by 80% on the paper's data.", "80%"),
    ],
)
def test_a_figure_typed_by_hand_in_a_page_fails_the_check(tmp_path, page, line, figure):
    assert check(ROOT, files=[ROOT / page]) == []  # the page as it is passes
    copy, number = _with_a_line(page, tmp_path, line)
    problems = check(ROOT, files=[copy])
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{copy}:{number}: {figure} is typed by hand"), problems[0]


def test_every_page_is_scanned():
    scanned = {str(p.relative_to(ROOT)) for p in pages(ROOT)}
    assert {"README.md", "recipe/diva_grpo/README.md", "docs/reliability.md", "docs/algo/pgpo.md"} <= scanned
    assert set(map(str, doc_numbers.marked_files(ROOT))) >= {str(ROOT / p) for p in scanned}


@pytest.mark.parametrize(
    "text, found",
    [
        ("DIVA is 2.5x faster, 3.2× here and 1.05 x there.", ["2.5x", "3.2×", "1.05 x"]),
        ("It keeps 80% of the steps, +4 % of the time, 20-60% of the runs.", ["80%", "4 %", "20-60%"]),
        (
            "The checkpoint is 721 MB (24 GB, 1.5 GiB, 512 KiB, an 80GB card).",
            ["721 MB", "24 GB", "1.5 GiB", "512 KiB", "80GB"],
        ),
        (
            "It took 10.8 min, 3.15 s a step, 139.5 ms, 2 hours and a 30-minute wait.",
            ["10.8 min", "3.15 s", "139.5 ms", "2 hours", "30-minute"],
        ),
        ("Accuracy 0.312, then 46.23; a gap of 1.9e-7 per token.", ["0.312", "46.23", "1.9e-7"]),
        ("| `hf_cpu` | 2.96 / 2.97 s (1.00x) |", ["2.96", "2.97 s", "1.00x"]),
        (
            "An array 0.5 wide, the stable 2.5x, a subversion 1.2: words ending like an exemption.",
            ["0.5", "2.5x", "1.2"],
        ),
    ],
)
def test_a_figure_of_any_format_is_found(text, found):
    assert [figure for _, figure in unsourced(text)] == found


@pytest.mark.parametrize(
    "text",
    [
        "Settings are code: `poll_interval_s=2.0`, `lr 1e-6`, `0.9` accuracy + `0.1` format.",
        "```bash\npython x.py --ratio 2.5  # 10 min\n```",
        "Maths: $\\epsilon = 0.2$ and $$D + 4 (0.5 - \\alpha)$$.",
        "arXiv 2603.01106, arXiv:2605.21125v2; verl 0.9.1, Python 3.11, torch 2.14.1, v0.4.",
        "Qwen2.5-VL-7B, gsm8k, an H100, fp8 on sm_90; Section 3.2 and Eq. 4.1; Table 2.",
        "[the paper](https://arxiv.org/abs/2603.01106v1) <!-- 0.5 in a comment -->",
        "Paid <!--=papers * record:pgpo.training_time_percent %.1f-->10.6<!--/-->% and 24 steps of 3 seeds.",
    ],
)
def test_what_is_not_a_figure(text):
    assert unsourced(text) == []


def test_a_benchmark_record_is_quoted(generator):
    record = json.loads((ROOT / "benchmarks/results/test_tiers/test_tiers.json").read_text())
    assert {"command", "machine", "date"} <= set(record)
    assert generator.figure("test_tiers * record:launch.minutes %.1f") == f"{record['launch']['minutes']:.1f}"
    papers = json.loads((ROOT / "benchmarks/results/papers/papers.json").read_text())
    assert generator.figure("papers * record:diva_grpo.accuracy.avg") == str(papers["diva_grpo"]["accuracy"]["avg"])
    assert generator.figure("papers * record:diva_grpo.step_time_over_grpo %x100") == "+4"
    with pytest.raises(DocNumbersError, match="no record 'nowhere'"):
        generator.figure("nowhere * record:x")
    with pytest.raises(DocNumbersError, match="no 'diva_grpo.nothing'"):
        generator.figure("papers * record:diva_grpo.nothing")


def test_every_benchmark_records_itself():
    """Each script in benchmarks/ saves its figures through record.py and takes --no-record."""
    scripts = sorted((ROOT / "benchmarks").glob("bench_*.py"))
    assert len(scripts) >= 14
    for script in scripts:
        text = script.read_text()
        assert "from record import" in text and "add_no_record(parser)" in text, script.name
        assert "record(" in text.replace("from record import", ""), script.name
