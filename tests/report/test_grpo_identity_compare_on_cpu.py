"""GRPO inside DIVA, the comparison (verl_ext.checks.grpo_identity) on run folders built by hand, and the task whose
images both datasets hand to the processor alike."""

from __future__ import annotations

import copy
import io
import json

import pytest
import torch
from report_fixtures import write_log

from verl_ext.checks.grpo_identity import (
    METRIC_TOLERANCE,
    RECORD_TOLERANCES,
    compare_runs,
    main,
    model_size,
    model_size_rows,
)

KEYS = [f"uid{q}_0_{r}" for q in range(2) for r in range(3)]


def _record(step: int) -> dict:
    """Two questions x 3 responses of up to 3 tokens, the score on the last real token; question 1's responses all
    score alike (a collapsed group: advantage 0)."""
    lengths = [3, 2, 3, 1, 3, 2]
    mask = torch.tensor([[1.0] * n + [0.0] * (3 - n) for n in lengths])
    scores = [1.0, 0.1, 0.55, 0.1, 0.1, 0.1]
    rewards = torch.zeros(6, 3)
    for i, n in enumerate(lengths):
        rewards[i, n - 1] = scores[i]
    advantages = torch.tensor([1.0, -1.0, 0.0, 0.0, 0.0, 0.0]).unsqueeze(1) * mask
    log_probs = -torch.arange(1, 19, dtype=torch.float32).reshape(6, 3) / 10 * mask
    prompt = [[7, 8, 9 + q] for q in (0, 0, 0, 1, 1, 1)]
    responses = [torch.tensor([20 + i] * n) for i, n in enumerate(lengths)]
    return {
        "step": step,
        "keys": list(KEYS),
        "is_padding": [False] * 6,
        "response_mask": mask,
        "rm_scores": rewards,
        "advantages": advantages,
        "old_log_probs": log_probs.clone(),
        "rollout_log_probs": log_probs.clone(),
        "responses": responses,
        "input_ids": [torch.cat([torch.tensor(p), r]) for p, r in zip(prompt, responses, strict=True)],
    }


def _metrics(step: int, own: str) -> dict:
    return {
        "actor/pg_loss": -0.0123 * step,
        "actor/grad_norm": 2.5 + step,
        "critic/score/mean": 0.3,
        "critic/advantages/max": 1.0,
        "response_length/mean": 2.3,
        "timing_s/step": 3.0 + step,  # the machine's, never compared
        **(
            {"grpo/collapse_rate": 0.5}
            if own == "grpo"
            else {"diva/collapse_rate/local": 0.5, "diva/difficulty/mean": 5.0}
        ),
    }


def _run(folder, own: str, records=None, metrics=None):
    """A run folder as tiny_cpu.sh leaves it: metrics/<project>/<experiment>.jsonl and probe records."""
    metrics = metrics or {step: _metrics(step, own) for step in (1, 2)}
    write_log(folder / "metrics" / "proj" / f"tiny_cpu_{own}.jsonl", sorted(metrics.items()))
    (folder / "probe").mkdir(parents=True, exist_ok=True)
    for step, record in (records or {s: _record(s) for s in (1, 2)}).items():
        torch.save(record, folder / "probe" / f"actor_inputs_step{step}.pt")
    return str(folder)


def test_the_same_runs_compare_equal_on_every_value(tmp_path):
    result = compare_runs(_run(tmp_path / "grpo", "grpo"), _run(tmp_path / "diva", "diva"))
    assert result.ok and result.differing == [] and result.steps == [1, 2]
    # 6 metrics a step (the collapse rate under its two names); per step 6 responses' prompt, tokens, mask and
    # reward, and 14 response tokens' advantage and two log-probs.
    assert result.stats["metric/grpo/collapse_rate"].values == 2
    assert "metric/timing_s/step" not in result.stats
    assert result.only_candidate == ["diva/difficulty/mean"] and result.only_reference == []
    assert result.stats["record/response_tokens"].values == 12
    assert result.stats["record/advantage"].values == 28
    assert result.values == 2 * 6 + 2 * 4 * 6 + 3 * 28


def test_a_value_past_its_tolerance_is_named(tmp_path):
    metrics = {step: _metrics(step, "diva") for step in (1, 2)}
    metrics[2]["actor/grad_norm"] *= 1 + 3 * METRIC_TOLERANCE.rtol  # the 1.5e-4 gap would fail too
    metrics[1]["critic/score/mean"] *= 1 + METRIC_TOLERANCE.rtol / 2  # within
    result = compare_runs(_run(tmp_path / "grpo", "grpo"), _run(tmp_path / "diva", "diva", metrics=metrics))
    assert not result.ok and result.differing == ["metric/actor/grad_norm"]
    stats = result.stats["metric/actor/grad_norm"]
    assert stats.beyond == 1 and stats.worst_step == 2 and stats.max_rel == pytest.approx(3e-4)


def test_advantages_agree_to_verls_float32_residue_not_beyond(tmp_path):
    records = {s: _record(s) for s in (1, 2)}
    # verl's float32 z-score of the collapsed group: ~1e-7, not 0. Allowed.
    records[1]["advantages"][3:, :] = 1.2e-7 * records[1]["response_mask"][3:, :]
    result = compare_runs(_run(tmp_path / "grpo", "grpo"), _run(tmp_path / "diva", "diva", records=records))
    assert result.ok, result.differing
    assert result.stats["record/advantage"].max_abs == pytest.approx(1.2e-7, rel=1e-3)
    # A real advantage difference is not.
    records[2]["advantages"][0, 0] += 10 * RECORD_TOLERANCES["advantage"].atol
    result = compare_runs(_run(tmp_path / "grpo2", "grpo"), _run(tmp_path / "diva2", "diva", records=records))
    assert result.differing == ["record/advantage"] and result.stats["record/advantage"].beyond == 1


@pytest.mark.parametrize(
    "change, key",
    [
        (lambda r: r["responses"].__setitem__(1, torch.tensor([99, 21])), "record/response_tokens"),
        (lambda r: r["input_ids"].__setitem__(0, torch.tensor([7, 8, 10, 20, 20, 20])), "record/prompt_tokens"),
        (lambda r: r["rm_scores"].__setitem__((0, 2), 0.9), "record/reward"),
        (lambda r: r["old_log_probs"].__setitem__((4, 0), -1.0), "record/old_log_probs"),
        (lambda r: r["rollout_log_probs"].__setitem__((4, 0), -1.0), "record/rollout_log_probs"),
        (lambda r: r["response_mask"].__setitem__((1, 2), 1.0), "record/response_mask"),
        (lambda r: r.__setitem__("keys", ["other"] + r["keys"][1:]), "record/response_tokens"),
    ],
)
def test_each_record_field_is_compared(tmp_path, change, key):
    records = {s: _record(s) for s in (1, 2)}
    change(records[2])
    result = compare_runs(_run(tmp_path / "grpo", "grpo"), _run(tmp_path / "diva", "diva", records=records))
    assert result.differing == [key], result.to_json()["keys"][key]


def test_rows_match_by_key_not_position_and_padding_is_skipped(tmp_path):
    records = {s: _record(s) for s in (1, 2)}
    shuffled = copy.deepcopy(records[1])
    order = [3, 0, 5, 1, 4, 2]
    for name in ("response_mask", "rm_scores", "advantages", "old_log_probs", "rollout_log_probs"):
        shuffled[name] = shuffled[name][order]
    for name in ("keys", "responses", "input_ids"):
        shuffled[name] = [shuffled[name][i] for i in order]
    # A padding row (verl pads a batch to the ranks' multiple) is no response.
    shuffled["keys"].append("pad")
    shuffled["is_padding"] = [False] * 6 + [True]
    for name in ("response_mask", "rm_scores", "advantages", "old_log_probs", "rollout_log_probs"):
        shuffled[name] = torch.cat([shuffled[name], torch.full((1, 3), 5.0)])
    shuffled["responses"].append(torch.tensor([1]))
    shuffled["input_ids"].append(torch.tensor([1, 1]))
    records[1] = shuffled
    result = compare_runs(_run(tmp_path / "grpo", "grpo"), _run(tmp_path / "diva", "diva", records=records))
    assert result.ok, result.differing


def test_a_step_one_run_did_not_log_or_record_fails(tmp_path):
    metrics = {1: _metrics(1, "diva")}
    result = compare_runs(
        _run(tmp_path / "grpo", "grpo"), _run(tmp_path / "diva", "diva", records={1: _record(1)}, metrics=metrics)
    )
    assert not result.ok and result.differing == []
    assert result.missing_steps == ["step 2 only in the reference", "record of step 2 only in the reference"]


def test_the_cli_prints_writes_json_and_exits_1_on_a_difference(tmp_path, capsys):
    grpo, diva = _run(tmp_path / "grpo", "grpo"), _run(tmp_path / "diva", "diva")
    assert main(["compare", grpo, diva, "--json", str(tmp_path / "same.json")]) == 0
    assert "compared: the same" in capsys.readouterr().out
    assert json.loads((tmp_path / "same.json").read_text())["ok"] is True
    metrics = {step: _metrics(step, "diva") for step in (1, 2)}
    metrics[1]["actor/pg_loss"] = 0.5
    other = _run(tmp_path / "diva2", "diva", metrics=metrics)
    assert main(["compare", grpo, other, "--json", str(tmp_path / "differ.json")]) == 1
    out = capsys.readouterr().out
    assert "1 key(s) differ: metric/actor/pg_loss" in out and "step 1: -0.0123 vs 0.5" in out
    written = json.loads((tmp_path / "differ.json").read_text())
    assert written["differing"] == ["metric/actor/pg_loss"] and written["keys"]["metric/actor/pg_loss"]["beyond"] == 1


def test_model_size_images_reach_the_processor_alike_from_both_datasets():
    """Finding behind the task: DIVA's dataset gives each image ``max_pixels`` for the processor and verl's gives none,
    so qwen_vl_utils resizes a 384 x 288 figure to 84 x 56 for DIVA and to 392 x 280 for GRPO, which the processor
    then shrinks to the same patch grid by another route: other pixels (the 1.5e-4 gradient-norm gap measured before
    the task was prepared). A figure already at 84 x 56 is left as it is by both."""
    pytest.importorskip("torchvision")  # qwen_vl_utils imports it
    from PIL import Image
    from qwen_vl_utils import fetch_image

    from data_prep.synth import synth_rows
    from verl_ext.cpu.tiny_model import MAX_PIXELS, MERGE_SIZE, MIN_PIXELS, PATCH_SIZE

    factor = PATCH_SIZE * MERGE_SIZE
    assert model_size(384, 288, MAX_PIXELS, factor) == (84, 56)
    row = next(synth_rows(1, seed=0))
    [prepared] = list(model_size_rows([row], MAX_PIXELS, factor))
    assert {k: v for k, v in prepared.items() if k != "images"} == {k: v for k, v in row.items() if k != "images"}

    def seen(data: bytes, **limit):
        return fetch_image({"image": Image.open(io.BytesIO(data)), **limit}, image_patch_size=PATCH_SIZE)

    # The tiny model's processor (verl_ext.cpu.tiny_model) gives both the same patch grid, from different pixels.
    from transformers import Qwen2VLImageProcessor

    processor = Qwen2VLImageProcessor(
        min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=PATCH_SIZE, merge_size=MERGE_SIZE
    )

    def pixel_values(image):
        out = processor(images=[image], return_tensors="pt")
        return out["image_grid_thw"].tolist(), out["pixel_values"]

    raw = row["images"][0]["bytes"]
    diva, grpo = seen(raw, max_pixels=MAX_PIXELS), seen(raw)
    assert diva.size == (84, 56) and grpo.size == (392, 280)
    (diva_grid, diva_pixels), (grpo_grid, grpo_pixels) = pixel_values(diva), pixel_values(grpo)
    assert diva_grid == grpo_grid == [[1, 4, 6]] and not torch.equal(diva_pixels, grpo_pixels)
    small = prepared["images"][0]["bytes"]
    diva, grpo = seen(small, max_pixels=MAX_PIXELS), seen(small)
    assert diva.size == grpo.size == (84, 56) and diva.tobytes() == grpo.tobytes()
    assert torch.equal(pixel_values(diva)[1], pixel_values(grpo)[1])
