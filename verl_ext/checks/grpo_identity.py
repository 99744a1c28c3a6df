"""GRPO inside DIVA, value by value: two run folders compared on everything they logged and everything the actor
consumed, step by step.

With every addition off (:mod:`verl_ext.cpu.ablations`, ``WITHOUT=all``) the DIVA trainer is verl's GRPO: one prompt
per question with all its responses, the advantage a z-score over them. A run of it and a run of the GRPO baseline
(``METHOD=grpo``: verl's estimator, verl's ``RLHFDataset`` through
:class:`~verl_ext.data.pixel_limit.PixelLimitedDataset`) with the same seed, data and responses per question must
then log the same values. :func:`compare_runs` reads both run folders and compares

* every metric both logged at every step (verl's file logger, merged as ``diva-report`` merges it), but for those
  that measure the machine rather than the run (:data:`verl_ext.checks.same_run.TIME_DEPENDENT`); metrics only one
  method logs (``diva/...``, ``grpo/...``) are listed, not compared, except the collapse rate, the training accuracy
  and the advantage statistics, which both log under their own names (:data:`SAME_METRIC`);
* what the actor consumed (the probe records, :mod:`verl_ext.checks.probe`), response by response, matched by their
  TransferQueue key (the same in both runs: :func:`verl_ext.rollout.seeds.prompt_uid`): the prompt and response
  tokens and the response mask, the reward, the advantage and the old and rollout log-probs of every response token.

Each value has a tolerance (:data:`METRIC_TOLERANCE`, :data:`RECORD_TOLERANCES`; its ``why`` says where a
difference can come from) and the result (:class:`IdentityResult`) holds, per key, how many values were compared,
the largest absolute and relative difference and how many exceed the tolerance.

Both datasets give every image ``diva.variants.max_pixels`` for the processor (:mod:`verl_ext.data.pixel_limit`;
before it, verl's plain dataset sent the images unlimited, and the two runs saw them at different resolutions).
:func:`prepare_task` also writes the tiny run's task at the size the model takes (:func:`model_size`), so that the
check does not rest on the resize either.

``python -m verl_ext.checks.grpo_identity task WORKDIR`` prepares that task in a ``run_scripts/tiny_cpu.sh`` work
folder; ``python -m verl_ext.checks.grpo_identity compare GRPO_RUN DIVA_RUN`` prints the comparison (``--json FILE``
writes it) and exits 1 when a value differs beyond its tolerance (docs/algo/diva_grpo.md, "GRPO inside DIVA").
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field

from verl_ext.checks.same_run import TIME_DEPENDENT


@dataclass(frozen=True)
class Tolerance:
    """``|candidate - reference| <= atol + rtol * |reference|`` (numpy's ``isclose``); ``why``: the difference it
    allows for."""

    atol: float
    rtol: float
    why: str

    def allows(self, reference: float, candidate: float) -> bool:
        if math.isnan(reference) or math.isnan(candidate):
            return math.isnan(reference) and math.isnan(candidate)
        return abs(candidate - reference) <= self.atol + self.rtol * abs(reference)


EXACT = Tolerance(0.0, 0.0, "the same seeds, weights and inputs draw the same tokens and score them alike")
# The figure: every logged value to 1e-4 relative. The absolute part is for values near 0 (the policy loss is
# minus a token mean of advantages; an advantage may differ by ~1e-7, below).
METRIC_TOLERANCE = Tolerance(
    1e-6,
    1e-4,
    "float32 rounding carried through a step: the advantages (below), then the loss and the gradient they give "
    "(measured: loss 2e-6 relative on hf_cpu, 2e-5 on vLLM; gradient norm 1.5e-7)",
)
RECORD_TOLERANCES = {
    "prompt_tokens": EXACT,
    "response_tokens": EXACT,
    "response_mask": EXACT,
    "reward": EXACT,
    # verl's GRPO computes (s - mean) / (std + eps) in float32 and leaves a group of equal scores a rounding residue
    # (~1e-7); the DIVA advantage writes an exact 0 there and computes the rest in float64. 1e-6 is ten times that.
    "advantage": Tolerance(
        1e-6, 0.0, "verl's float32 z-score leaves ~1e-7 where the DIVA advantage (float64) writes an exact 0"
    ),
    # The same tokens through weights that agree to float rounding after an update from advantages that agree to
    # ~1e-7 (measured: 9.5e-7, two float32 ulps of a log-prob near -5, on both rollouts).
    "old_log_probs": Tolerance(1e-4, 0.0, "weights updated from advantages that agree to ~1e-7"),
    "rollout_log_probs": Tolerance(1e-4, 0.0, "weights updated from advantages that agree to ~1e-7"),
}
# A metric both methods log, each under its own name: GRPO's -> DIVA's. DIVA's local stream is GRPO's prompt group;
# both count the responses of an equal-score group as zero-advantage (verl_ext.algos.collapse).
SAME_METRIC = {
    "grpo/collapse_rate": "diva/collapse_rate/local",
    "grpo/accuracy/mean": "diva/accuracy/mean",
    **{f"grpo/advantage/{s}": f"diva/advantage/{s}" for s in ("mean", "std", "min", "max", "zero_fraction")},
}


@dataclass
class KeyStats:
    """The comparison of one key over all steps: ``values`` compared, ``beyond`` of them past ``tolerance``, the
    largest absolute and relative difference and the step of the largest relative one."""

    key: str
    tolerance: Tolerance
    values: int = 0
    beyond: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    worst_step: int | None = None
    notes: list[str] = field(default_factory=list)

    def add(self, step: int, reference: float, candidate: float) -> None:
        reference, candidate = float(reference), float(candidate)
        self.values += 1
        if not self.tolerance.allows(reference, candidate):
            self.beyond += 1
            if len(self.notes) < 5:
                self.notes.append(f"step {step}: {reference!r} vs {candidate!r}")
        diff = abs(candidate - reference) if not (math.isnan(reference) and math.isnan(candidate)) else 0.0
        if math.isnan(diff):
            diff = math.inf
        rel = diff / abs(reference) if reference else (0.0 if diff == 0 else math.inf)
        self.max_abs = max(self.max_abs, diff)
        if self.worst_step is None or rel > self.max_rel:
            self.max_rel, self.worst_step = rel, step

    def fail(self, step: int, note: str) -> None:
        """A value that cannot be compared (missing on one side, a different shape) counts as beyond tolerance."""
        self.values += 1
        self.beyond += 1
        if len(self.notes) < 5:
            self.notes.append(f"step {step}: {note}")


@dataclass
class IdentityResult:
    """Per key (:class:`KeyStats`): ``metrics`` (``metric/<name>``) and ``records`` (``record/<name>``);
    ``steps`` compared; keys one run logged and the other did not; :attr:`differing`: the keys past tolerance."""

    steps: list[int]
    stats: dict[str, KeyStats]
    only_reference: list[str] = field(default_factory=list)
    only_candidate: list[str] = field(default_factory=list)
    missing_steps: list[str] = field(default_factory=list)

    @property
    def differing(self) -> list[str]:
        return sorted(key for key, stats in self.stats.items() if stats.beyond)

    @property
    def values(self) -> int:
        return sum(stats.values for stats in self.stats.values())

    @property
    def ok(self) -> bool:
        return not self.differing and not self.missing_steps and self.values > 0

    def to_json(self) -> dict:
        def number(x: float):
            return x if math.isfinite(x) else str(x)

        return {
            "ok": self.ok,
            "steps": self.steps,
            "values": self.values,
            "differing": self.differing,
            "missing_steps": self.missing_steps,
            "only_reference": self.only_reference,
            "only_candidate": self.only_candidate,
            "keys": {
                key: {**asdict(s), "max_abs": number(s.max_abs), "max_rel": number(s.max_rel)}
                for key, s in sorted(self.stats.items())
            },
        }


def compare_metrics(
    reference: dict[int, dict[str, float]],
    candidate: dict[int, dict[str, float]],
    stats: dict[str, KeyStats],
    tolerance: Tolerance = METRIC_TOLERANCE,
) -> tuple[list[str], list[str], list[str]]:
    """Add every metric of every step both logged to ``stats`` (``metric/<key>``, under the reference's name);
    returns ``(only_reference, only_candidate, missing_steps)``."""
    renamed = {theirs: ours for ours, theirs in SAME_METRIC.items()}
    only_ref: set[str] = set()
    only_cand: set[str] = set()
    missing = [f"step {s} only in the reference" for s in sorted(set(reference) - set(candidate))]
    missing += [f"step {s} only in the candidate" for s in sorted(set(candidate) - set(reference))]
    for step in sorted(set(reference) & set(candidate)):
        ref = {k: v for k, v in reference[step].items() if not TIME_DEPENDENT.search(k)}
        cand = {renamed.get(k, k): v for k, v in candidate[step].items() if not TIME_DEPENDENT.search(k)}
        only_ref |= set(ref) - set(cand)
        only_cand |= set(cand) - set(ref)
        for key in sorted(set(ref) & set(cand)):
            name = f"metric/{key}"
            stats.setdefault(name, KeyStats(name, tolerance)).add(step, ref[key], cand[key])
    return sorted(only_ref), sorted(only_cand), missing


def _rows(record: dict) -> dict[str, int]:
    """TransferQueue key -> row of the record's real (not padding) responses."""
    padding = record.get("is_padding") or [False] * len(record["keys"])
    return {str(key): row for row, key in enumerate(record["keys"]) if not padding[row]}


def _tokens(value) -> list[int]:
    return [int(t) for t in (value.tolist() if hasattr(value, "tolist") else value)]


def _row(record: dict, name: str, row: int, width: int):
    """Row ``row`` of a padded ``(B, T)`` field in float64, padded with zeros to ``width`` tokens."""
    import torch

    values = record[name][row].to(torch.float64)
    return torch.nn.functional.pad(values, (0, width - values.shape[0]))


def _compare_response(stat, step: int, key: str, ref: dict, i: int, cand: dict, j: int) -> None:
    """One response: row ``i`` of the reference's record against row ``j`` of the candidate's."""
    import torch

    # The whole prompt + response and the response, unpadded.
    ref_resp, cand_resp = _tokens(ref["responses"][i]), _tokens(cand["responses"][j])
    ref_seq, cand_seq = _tokens(ref["input_ids"][i]), _tokens(cand["input_ids"][j])
    ref_prompt, cand_prompt = ref_seq[: len(ref_seq) - len(ref_resp)], cand_seq[: len(cand_seq) - len(cand_resp)]
    for name, a, b in (("prompt_tokens", ref_prompt, cand_prompt), ("response_tokens", ref_resp, cand_resp)):
        if a == b:
            stat(name).add(step, 0.0, 0.0)
        else:
            stat(name).fail(step, f"{key}: {name} differ ({len(a)} vs {len(b)} tokens)")
    width = max(ref["response_mask"].shape[1], cand["response_mask"].shape[1])
    mask = _row(ref, "response_mask", i, width)
    if not torch.equal(mask, _row(cand, "response_mask", j, width)):
        stat("response_mask").fail(step, f"{key}: response masks differ")
        return
    stat("response_mask").add(step, 0.0, 0.0)
    reward = [float((_row(r, "rm_scores", k, width) * mask).sum()) for r, k in ((ref, i), (cand, j))]
    stat("reward").add(step, *reward)
    tokens = mask.bool()
    for name, field_name in (
        ("advantage", "advantages"),
        ("old_log_probs", "old_log_probs"),
        ("rollout_log_probs", "rollout_log_probs"),
    ):
        if field_name in ref and field_name in cand:
            a, b = _row(ref, field_name, i, width)[tokens], _row(cand, field_name, j, width)[tokens]
            for x, y in zip(a.tolist(), b.tolist(), strict=True):
                stat(name).add(step, x, y)


def compare_records(reference: dict[int, dict], candidate: dict[int, dict], stats: dict[str, KeyStats]) -> list[str]:
    """Add what the actor consumed (probe records, by step) response by response to ``stats`` (``record/<name>``:
    :data:`RECORD_TOLERANCES`); returns the steps recorded by one run only."""
    missing = [f"record of step {s} only in the reference" for s in sorted(set(reference) - set(candidate))]
    missing += [f"record of step {s} only in the candidate" for s in sorted(set(candidate) - set(reference))]

    def stat(name: str) -> KeyStats:
        return stats.setdefault(f"record/{name}", KeyStats(f"record/{name}", RECORD_TOLERANCES[name]))

    for step in sorted(set(reference) & set(candidate)):
        ref, cand = reference[step], candidate[step]
        ref_rows, cand_rows = _rows(ref), _rows(cand)
        if set(ref_rows) != set(cand_rows):
            stat("response_tokens").fail(
                step,
                f"different responses: {len(set(ref_rows) - set(cand_rows))} keys only in the reference, "
                f"{len(set(cand_rows) - set(ref_rows))} only in the candidate",
            )
            continue
        for key in sorted(ref_rows):
            _compare_response(stat, step, key, ref, ref_rows[key], cand, cand_rows[key])
    return missing


def compare_runs(reference_dir: str, candidate_dir: str) -> IdentityResult:
    """:func:`compare_metrics` and :func:`compare_records` of two run folders (the reference: the GRPO baseline)."""
    from verl_ext.checks.probe import read_actor_inputs
    from verl_ext.report.run import load_run

    stats: dict[str, KeyStats] = {}
    ref_log, cand_log = load_run(reference_dir).log.steps, load_run(candidate_dir).log.steps
    only_ref, only_cand, missing = compare_metrics(ref_log, cand_log, stats)
    ref_records, cand_records = read_actor_inputs(reference_dir), read_actor_inputs(candidate_dir)
    for records, which in ((ref_records, "the reference"), (cand_records, "the candidate")):
        if not records:
            missing.append(f"no probe records (probe/actor_inputs_step*.pt) in {which}")
    missing += compare_records(ref_records, cand_records, stats)
    steps = sorted(set(ref_log) & set(cand_log))
    return IdentityResult(steps, stats, only_ref, only_cand, missing)


# ------------------------------------------------------------------------------------------------------ the task


def model_size(width: int, height: int, max_pixels: int, factor: int) -> tuple[int, int]:
    """The ``(width, height)`` Qwen2-VL's processor resizes an image to (``smart_resize``: sides multiples of
    ``factor`` = patch x merge size, at most ``max_pixels``); an image of that size is left as it is by both verl's
    dataset and DIVA's."""
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    h, w = smart_resize(height, width, factor=factor, min_pixels=factor * factor, max_pixels=max_pixels)
    return w, h


def _resized_png(data: bytes, max_pixels: int, factor: int) -> bytes:
    from PIL import Image

    image = Image.open(io.BytesIO(data)).convert("RGB")
    size = model_size(image.width, image.height, max_pixels, factor)
    out = io.BytesIO()
    image.resize(size, Image.Resampling.BICUBIC).save(out, format="PNG", optimize=False)
    return out.getvalue()


def model_size_rows(rows, max_pixels: int, factor: int):
    """``rows`` (DIVA parquet rows) with every image already at the size the model takes (:func:`model_size`)."""
    for row in rows:
        images = [{**image, "bytes": _resized_png(image["bytes"], max_pixels, factor)} for image in row["images"]]
        yield {**row, "images": images}


def prepare_task(workdir: str) -> dict:
    """The tiny run's task (``verl_ext.cpu.launch.prepare``: the ``diva-prep synth`` questions, the tiny model) with
    every image at the model's input size, in ``workdir`` for ``run_scripts/tiny_cpu.sh`` (``WORKDIR``), which
    reuses the files it finds there; returns their paths."""
    from data_prep.parquet_io import DivaParquetWriter
    from data_prep.synth import synth_rows
    from verl_ext.cpu.launch import TRAIN_QUESTIONS, VAL_QUESTIONS, prepare
    from verl_ext.cpu.tiny_model import MAX_PIXELS, MERGE_SIZE, PATCH_SIZE

    os.makedirs(workdir, exist_ok=True)
    for name, count, seed, split in (("train", TRAIN_QUESTIONS, 0, "train"), ("val", VAL_QUESTIONS, 1, "test")):
        path = os.path.join(workdir, f"synth_{name}.parquet")
        if os.path.exists(path):
            continue
        with DivaParquetWriter(path) as writer:
            for row in model_size_rows(synth_rows(count, seed, split), MAX_PIXELS, PATCH_SIZE * MERGE_SIZE):
                writer.write(row)
            writer.commit()
    return prepare(workdir)


def format_result(result: IdentityResult) -> str:
    lines = [f"{'key':<44} {'values':>7} {'max abs':>10} {'max rel':>10}  tolerance (atol, rtol)  beyond"]
    for key, s in sorted(result.stats.items()):
        lines.append(
            f"{key:<44} {s.values:>7} {s.max_abs:>10.3g} {s.max_rel:>10.3g}  "
            f"({s.tolerance.atol:g}, {s.tolerance.rtol:g}){'':>10} {s.beyond}"
        )
        lines += [f"    {note}" for note in s.notes]
    for note in result.missing_steps:
        lines.append(f"missing: {note}")
    lines.append(f"only in the reference (not compared): {', '.join(result.only_reference) or '-'}")
    lines.append(f"only in the candidate (not compared): {', '.join(result.only_candidate) or '-'}")
    verdict = "the same" if result.ok else f"{len(result.differing)} key(s) differ: {', '.join(result.differing)}"
    lines.append(f"{result.values} values over steps {result.steps} compared: {verdict}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    task = sub.add_parser("task", help="write the task with model-size images into a tiny_cpu.sh work folder")
    task.add_argument("workdir")
    compare = sub.add_parser("compare", help="compare two run folders value by value; exit 1 if one differs")
    compare.add_argument("reference", help="the GRPO baseline's run folder (METHOD=grpo)")
    compare.add_argument("candidate", help="DIVA-GRPO's run folder with every addition off (WITHOUT=all)")
    compare.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args(argv)
    if args.command == "task":
        print(json.dumps(prepare_task(args.workdir)))
        return 0
    result = compare_runs(args.reference, args.candidate)
    print(format_result(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result.to_json(), f, indent=1)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
