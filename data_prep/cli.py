"""``diva-prep`` command line: ``convert``, ``variants``, ``validate``, ``synth``, ``swatch``, ``entropy``
(see ``diva-prep <cmd> --help``).

Exit status: 0 success; 1 the data failed (too many bad rows, validation errors, unfinished variant tasks);
2 bad arguments or unusable input (the message says which file, column or argument and what to do).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from data_prep.errors import PrepError
from data_prep.layouts import LAYOUT_NAMES
from verl_ext.version import version_line

EXAMPLES = """examples:
  diva-prep synth --output synth.parquet --n 64
  diva-prep swatch --output swatch.parquet --n 32
  diva-prep convert --input geometry3k/data --layout geometry3k --output g3k_train.parquet --split train
  diva-prep variants --input g3k_train.parquet --output g3k_train_v.parquet --model Qwen/Qwen2.5-VL-72B-Instruct \\
      --base-url http://localhost:8000/v1 --concurrency 64
  diva-prep validate g3k_train_v.parquet
  diva-prep entropy --model /models/Qwen2.5-VL-7B-Instruct --input g3k_train_v.parquet --output g3k_train_e.parquet
"""


def _add_convert(subparsers) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert a downloaded dataset (geometry3k, MMK12, JSONL, the paper's benchmarks) to DIVA parquet",
        description="Convert local files to DIVA parquet. Rows with undecodable images, empty answers or broken "
        "paths go to a quarantine JSONL (row index and reason); the command fails, writing no output, when the "
        "bad fraction exceeds --max-bad-fraction.",
    )
    parser.add_argument("--input", required=True, type=Path, help="parquet file or folder of *.parquet; .jsonl file")
    parser.add_argument(
        "--layout",
        required=True,
        choices=LAYOUT_NAMES,
        help="geometry3k: images, problem, answer | mmk12: image, question, answer, subject | "
        "jsonl: question, answer, image or images (paths relative to the .jsonl file) | the paper's benchmarks: "
        "mathvista, mathverse, mathvision, olympiadbench, wemath (their Hugging Face columns) | "
        "auto: pick the layout from the columns found",
    )
    parser.add_argument("--output", required=True, type=Path, help="DIVA parquet to write")
    parser.add_argument("--split", default="train", help="split name stored in extra_info and the question ids")
    parser.add_argument("--data-source", default=None, help="data_source column (default: layout name or file stem)")
    parser.add_argument("--max-bad-fraction", type=float, default=0.0, help="quarantined rows allowed (0 to 1)")
    parser.add_argument("--quarantine", type=Path, default=None, help="default: <output stem>.quarantine.jsonl")
    parser.add_argument("--workers", type=int, default=None, help="image-decoding threads (default: cores, max 8)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_variants(subparsers) -> None:
    parser = subparsers.add_parser(
        "variants",
        help="generate paraphrases and reasoning hints with an OpenAI-compatible endpoint",
        description="Fill the paraphrases and hint_steps columns of a DIVA parquet. The API key is read from the "
        "OPENAI_API_KEY environment variable only (a placeholder is used for local servers when it is unset). "
        "Finished tasks are cached: rerunning the same command after a crash or kill resumes without repeating "
        "requests. Rejected generations are recorded with their reason in the rejects file.",
    )
    parser.add_argument("--input", required=True, type=Path, help="DIVA parquet (from convert)")
    parser.add_argument("--output", required=True, type=Path, help="DIVA parquet to write")
    parser.add_argument("--model", required=True, help="model name served by the endpoint")
    parser.add_argument("--base-url", default=None, help="e.g. http://localhost:8000/v1 (default: OPENAI_BASE_URL)")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight at most")
    parser.add_argument("--paraphrases", type=int, default=2, help="paraphrases wanted per question")
    parser.add_argument("--limit", type=int, default=None, help="only the first N rows (output holds those rows)")
    parser.add_argument("--cache", type=Path, default=None, help="cache folder (default: <output>.cache)")
    parser.add_argument("--rejects", type=Path, default=None, help="default: <output stem>.rejects.jsonl")
    parser.add_argument("--attempts", type=int, default=2, help="generations per task before giving up on it")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-tokens", type=int, default=1024, help="completion tokens per request")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request before it is retried")
    parser.add_argument("--max-retries", type=int, default=6, help="retries per request on 429, 5xx and timeouts")
    parser.add_argument("--backoff", type=float, default=1.0, help="first retry delay in seconds (doubles each time)")
    parser.add_argument("--text-only", action="store_true", help="never send images (text-only models)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_validate(subparsers) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="check a DIVA parquet (schema, placeholders, images, answers, ids, hint leaks)",
        description="Schema and content checks with a readable report; exit status 1 when there are errors.",
    )
    parser.add_argument("path", type=Path, help="DIVA parquet to check")
    parser.add_argument("--max-examples", type=int, default=5, help="rows shown per failing check")


def _add_synth(subparsers) -> None:
    parser = subparsers.add_parser(
        "synth",
        help="write a small synthetic multimodal math set (bar charts, number lines, rectangles, triangles)",
        description="Deterministic synthetic rows with integer answers, paraphrases and hint steps: no download.",
    )
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--n", type=int, required=True, help="number of rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", default="train")


def _add_swatch(subparsers) -> None:
    parser = subparsers.add_parser(
        "swatch",
        help="write colour-swatch questions a tiny model can learn (the CPU comparison's task)",
        description="One coloured square per 84 x 84 image; the answer is the number its colour stands for. "
        "Hardness (square size, fading) is drawn per row or fixed; hints, paraphrases and image perturbations "
        "make DIVA's variants meaningful for it (data_prep/swatch.py).",
    )
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--n", type=int, required=True, help="number of rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", default="train")
    parser.add_argument("--hardness", type=float, default=None, help="fixed hardness in [0, 1] (default: uniform)")


def _add_entropy(subparsers) -> None:
    parser = subparsers.add_parser(
        "entropy",
        help="compute each row's visual entropy with the policy's vision encoder (Durian's perceptual buckets)",
        description="Run the vision tower of a local Qwen2.5-VL / Qwen2-VL checkpoint over each row's images (CUDA "
        "when present, else CPU), take the eigenvalue entropy of the covariance of the patch features (mean over a "
        "row's images) and store it in extra_info.visual_entropy. Finished rows are cached: rerunning the same "
        "command after a crash or kill resumes. Rows without an image or with an undecodable one go to a "
        "quarantine JSONL and are left out; the command fails, writing no output, when their fraction exceeds "
        "--max-bad-fraction.",
    )
    parser.add_argument("--model", required=True, type=Path, help="local checkpoint folder of the policy model")
    parser.add_argument("--input", required=True, type=Path, help="DIVA parquet")
    parser.add_argument("--output", required=True, type=Path, help="DIVA parquet to write (with visual_entropy)")
    parser.add_argument("--device", default="auto", help="auto (cuda when available, else cpu), cpu, cuda, cuda:1")
    parser.add_argument("--dtype", default="auto", help="auto (bfloat16 on cuda, float32 on cpu), float32, ...")
    parser.add_argument(
        "--features",
        choices=("patch", "merged"),
        default="patch",
        help="patch: the vision transformer's patch features (default); merged: the patch merger's output tokens",
    )
    parser.add_argument("--max-pixels", type=int, default=None, help="per image (default: diva.variants.max_pixels)")
    parser.add_argument("--min-pixels", type=int, default=None, help="per image (default: the image processor's)")
    parser.add_argument("--cache", type=Path, default=None, help="cache folder (default: <output>.cache)")
    parser.add_argument("--quarantine", type=Path, default=None, help="default: <output stem>.quarantine.jsonl")
    parser.add_argument("--max-bad-fraction", type=float, default=0.0, help="quarantined rows allowed (0 to 1)")
    parser.add_argument("--workers", type=int, default=None, help="image-decoding threads (default: cores, max 4)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diva-prep",
        description="Build DIVA-GRPO training data (parquet) offline.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log retries and cache details")
    parser.add_argument("--version", action="version", version=version_line("diva-prep"))
    subparsers = parser.add_subparsers(
        dest="command", required=True, metavar="{convert,variants,validate,synth,swatch,entropy}"
    )
    _add_convert(subparsers)
    _add_variants(subparsers)
    _add_validate(subparsers)
    _add_synth(subparsers)
    _add_swatch(subparsers)
    _add_entropy(subparsers)
    return parser


def _convert(args) -> int:
    from data_prep.convert import convert, format_summary

    summary = convert(
        args.input,
        args.layout,
        args.output,
        split=args.split,
        data_source=args.data_source,
        quarantine_path=args.quarantine,
        max_bad_fraction=args.max_bad_fraction,
        workers=args.workers,
        progress=not args.no_progress,
    )
    print(format_summary(summary, args.max_bad_fraction))
    return 1 if summary.failed else 0


def _variants(args) -> int:
    from data_prep.llm_client import RetryPolicy
    from data_prep.variants import VariantsOptions, run_variants

    options = VariantsOptions(
        model=args.model,
        base_url=args.base_url,
        concurrency=args.concurrency,
        paraphrases=args.paraphrases,
        limit=args.limit,
        cache_dir=args.cache,
        rejects_path=args.rejects,
        attempts=args.attempts,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        request_timeout=args.timeout,
        retry=RetryPolicy(max_retries=args.max_retries, base_delay=args.backoff),
        text_only=args.text_only,
        progress=not args.no_progress,
    )
    summary = run_variants(args.input, args.output, options)
    print(summary.format())
    return 1 if summary.failed_tasks else 0


def _validate(args) -> int:
    from data_prep.validate import validate_file

    report = validate_file(args.path)
    print(report.format(args.max_examples))
    return 0 if report.ok else 1


def _synth(args) -> int:
    from data_prep.synth import synth

    if args.n < 1:
        raise PrepError(f"--n must be at least 1, got {args.n}")
    rows = synth(args.output, args.n, args.seed, args.split)
    print(f"wrote {rows} synthetic rows to {args.output}")
    return 0


def _swatch(args) -> int:
    from data_prep.swatch import swatch

    if args.n < 1:
        raise PrepError(f"--n must be at least 1, got {args.n}")
    if args.hardness is not None and not 0.0 <= args.hardness <= 1.0:
        raise PrepError(f"--hardness must be in [0, 1], got {args.hardness}")
    rows = swatch(args.output, args.n, args.seed, args.split, args.hardness)
    print(f"wrote {rows} swatch rows to {args.output}")
    return 0


def _entropy(args) -> int:
    from data_prep.entropy import EntropyOptions, run_entropy

    options = EntropyOptions(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        features=args.features,
        min_pixels=args.min_pixels,
        cache_dir=args.cache,
        quarantine_path=args.quarantine,
        max_bad_fraction=args.max_bad_fraction,
        workers=args.workers,
        progress=not args.no_progress,
    )
    if args.max_pixels is not None:
        options.max_pixels = args.max_pixels
    summary = run_entropy(args.input, args.output, options)
    print(summary.format())
    return 1 if summary.failed else 0


COMMANDS = {
    "convert": _convert,
    "variants": _variants,
    "validate": _validate,
    "synth": _synth,
    "swatch": _swatch,
    "entropy": _entropy,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    if not args.verbose:
        logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        return COMMANDS[args.command](args)
    except PrepError as exc:
        print(f"diva-prep {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"diva-prep {args.command}: interrupted (variants resumes from its cache when rerun)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
