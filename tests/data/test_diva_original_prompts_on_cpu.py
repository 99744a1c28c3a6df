"""DIVA-GRPO's variants addition moves only what it should: turning variants on adds prompts beside each question's
original and leaves the original itself as it is without them (text, images, every field of the row), whatever the
question's difficulty or the epoch; and the original is verl's own ``RLHFDataset`` row with DIVA's ``extra_info``
keys and the image resolution limit added (docs/algo/diva_grpo.md, "GRPO inside DIVA")."""

from __future__ import annotations

import numpy as np
import pytest
from diva_data_fixtures import PROCESSOR, data_config, images_of, user_text
from verl.utils.dataset.rl_dataset import RLHFDataset

from verl_ext.data.dataset import DIVA_ONLY_COLUMNS, EXTRA_INFO_KEYS, DivaDataset
from verl_ext.data.pixel_limit import image_items

# Difficulties across the planner's range: easy (image perturbations), middling (paraphrases), hard (hints).
DIFFICULTIES = [1.0, 3.0, 5.0, 7.0, 9.0, 2.0]


def _dataset(files, m: int, difficulties=None) -> DivaDataset:
    train, val, root = files
    ds = DivaDataset(train, None, data_config([train], [val], root / "cache", variants_per_question=m), PROCESSOR)
    if difficulties is not None:
        ds.difficulty_table.write_rows(range(len(difficulties)), difficulties)
    return ds


def _original(ds: DivaDataset, question: int, epoch: int = 0) -> dict:
    row = ds[epoch * len(ds) + question * ds.block_size]
    assert row["extra_info"]["variant_slot"] == 0 and row["extra_info"]["variant_kind"] == "original"
    return row


def _comparable(row: dict) -> dict:
    """The row with its images as pixel arrays (PIL images compare by identity)."""
    out = {key: value for key, value in row.items() if key not in ("raw_prompt", "dummy_tensor")}
    out["text"] = user_text(row)
    out["pixels"] = [np.asarray(image.convert("RGB")).tobytes() for image in images_of(row)]
    out["image_items"] = [{k: v for k, v in item.items() if k != "image"} for item in image_items(row["raw_prompt"])]
    return out


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("epoch", [0, 2])
def test_variants_on_leave_the_originals_prompts_unchanged(parquet_files, m, epoch):
    plain = _dataset(parquet_files, 0, DIFFICULTIES)
    expanded = _dataset(parquet_files, m, DIFFICULTIES)
    kinds = set()
    for q in range(plain.num_questions):
        without, with_variants = _original(plain, q, epoch), _original(expanded, q, epoch)
        assert _comparable(with_variants) == _comparable(without), q
        kinds |= {expanded[q * (1 + m) + s]["extra_info"]["variant_kind"] for s in range(1, 1 + m)}
    # The variants beside them were real ones, of the kinds the difficulties ask for.
    assert {"image_perturb", "hint"} <= kinds


def test_an_original_does_not_depend_on_its_questions_difficulty(parquet_files):
    """The difficulty picks the variants; the original only records it (``question_difficulty``)."""
    for q in range(len(DIFFICULTIES)):
        rows = []
        for d in (1.0, 5.0, 9.0):
            ds = _dataset(parquet_files, 1, [d] * len(DIFFICULTIES))
            row = _comparable(_original(ds, q))
            assert row["extra_info"].pop("question_difficulty") == row["extra_info"].pop("variant_difficulty") == d
            rows.append(row)
        assert rows[0] == rows[1] == rows[2]


def test_an_original_is_verls_row_with_divas_extra_info_and_resolution_limit(parquet_files):
    """What the GRPO baseline's dataset (verl's ``RLHFDataset``) gives for the same training question: the same text
    and pixels; DIVA adds its ``extra_info`` keys, drops its own parquet columns and gives each image
    ``diva.variants.max_pixels`` (so an image larger than that reaches the processor smaller than under GRPO:
    the GRPO inside DIVA check prepares its images at the model's input size)."""
    train, val, root = parquet_files
    reference = RLHFDataset(train, None, data_config([train], [val], root / "cache"), processor=PROCESSOR)
    ds = _dataset(parquet_files, 1, DIFFICULTIES)
    for q in range(ds.num_questions):
        ours, theirs = _comparable(_original(ds, q)), _comparable(reference[q])
        assert set(ours) == set(theirs) - set(DIVA_ONLY_COLUMNS)
        assert [item.pop("max_pixels") for item in ours["image_items"]] == [ds.diva_config.variants.max_pixels] * len(
            ours["image_items"]
        )
        for message in ours["prompt"]:  # the stored messages: the same image items
            for item in message["content"] if isinstance(message["content"], list) else []:
                item.pop("max_pixels", None)
        extra, their_extra = ours.pop("extra_info"), theirs.pop("extra_info")
        assert {k: extra[k] for k in their_extra} == their_extra  # question_id: the parquet's, kept
        assert set(extra) - set(their_extra) <= set(EXTRA_INFO_KEYS)
        assert {key: value for key, value in theirs.items() if key in ours} == ours
