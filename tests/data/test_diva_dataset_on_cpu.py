"""DivaDataset with verl's real RLHFDataset, collate_fn and a torchdata StatefulDataLoader (2 workers)."""

import json
import math
import re

import numpy as np
import pyarrow.parquet as pq
import pytest
from diva_data_fixtures import PROCESSOR, data_config, images_of, make_row, picture, png_bytes, user_text, write_parquet
from PIL import Image
from torchdata.stateful_dataloader import StatefulDataLoader
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

from verl_ext.data.dataset import (
    DIVA_ONLY_COLUMNS,
    EXTRA_INFO_KEYS,
    TEXT_IN_IMAGE_QUESTION,
    DivaDataset,
    resolve_split,
)
from verl_ext.data.pixel_limit import image_items
from verl_ext.data.sampler import QuestionBlockSampler
from verl_ext.data.schema import HINT_HEADER


def build(files, split=None, path=None, **variants):
    train, val, root = files
    config = data_config([train], [val], root / "cache", **variants)
    target = path or (train if split != "val" else val)
    return DivaDataset(target, None, config, processor=PROCESSOR, split=split)


def pixels(image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.float64)


# ------------------------------------------------------------------------------ train or validation
def test_split_is_decided_from_the_data_files(parquet_files, tmp_path):
    train, val, root = parquet_files
    config = data_config([train], [val], root)
    assert resolve_split(train, config) == "train"
    assert resolve_split([val], config) == "val"
    assert resolve_split(val, config, split="train") == "train"  # explicit argument wins
    config.diva_split = "val"
    assert resolve_split(train, config) == "val"
    same = data_config([train], [train], root)
    with pytest.raises(ValueError, match="same files"):
        resolve_split(train, same)
    with pytest.raises(ValueError, match="neither data.train_files"):
        resolve_split(str(tmp_path / "other.parquet"), data_config([train], [val], root))
    # what verl's create_rl_dataset does: same data config, no split argument
    assert DivaDataset(train, None, data_config([train], [val], root), processor=PROCESSOR).split == "train"
    assert DivaDataset(val, None, data_config([train], [val], root), processor=PROCESSOR).split == "val"


@pytest.mark.parametrize("m", [1, 3])
def test_training_layout_expands_each_question_into_a_block(parquet_files, m):
    ds = build(parquet_files, variants_per_question=m)
    assert ds.num_questions == 6 and ds.block_size == 1 + m and len(ds) == 6 * (1 + m)
    assert ds.locate(0) == (0, 0, 0)
    assert ds.locate(1 + m + 1) == (1, 1, 0)
    assert ds.locate(len(ds) * 2 + (1 + m) * 5 + m) == (5, m, 2)
    rows = [ds[i] for i in range(len(ds))]
    assert [r["extra_info"]["question_id"] for r in rows] == [f"q{q}" for q in range(6) for _ in range(1 + m)]
    assert [r["extra_info"]["variant_slot"] for r in rows] == list(range(1 + m)) * 6
    assert all((r["extra_info"]["variant_kind"] == "original") == (r["extra_info"]["variant_slot"] == 0) for r in rows)


def test_validation_rows_equal_rlhf_dataset_plus_extra_info(parquet_files):
    train, val, root = parquet_files
    ds = build(parquet_files, split="val", variants_per_question=3)
    ref = RLHFDataset(val, None, data_config([train], [val], root / "cache"), processor=PROCESSOR)
    assert len(ds) == len(ref) == 3
    for i in range(3):
        ours, theirs = ds[i], ref[i]
        # Differences by design: the DIVA-only parquet columns are dropped after use, and every image carries the
        # resolution limit (diva.variants.max_pixels) for the processor.
        assert set(ours) == set(theirs) - set(DIVA_ONLY_COLUMNS)
        assert all(
            item.pop("max_pixels") == ds.diva_config.variants.max_pixels for item in image_items(ours["raw_prompt"])
        )
        for key in set(ours) - {"raw_prompt", "prompt", "extra_info", "dummy_tensor"}:
            assert ours[key] == theirs[key], key
        kept = {k: v for k, v in ours["extra_info"].items() if k not in EXTRA_INFO_KEYS}
        assert kept == {k: v for k, v in theirs["extra_info"].items() if k not in EXTRA_INFO_KEYS}
        assert ours["extra_info"]["question_id"] == theirs["extra_info"]["question_id"] == f"v{i}"
        assert set(EXTRA_INFO_KEYS) <= set(ours["extra_info"])
        assert ours["extra_info"]["variant_kind"] == "original" and ours["extra_info"]["variant_fallback"] == ""
        assert ours["extra_info"]["variant_difficulty"] == ours["extra_info"]["question_difficulty"] == 5.0
        assert user_text(ours) == user_text(theirs)
        for a, b in zip(images_of(ours), images_of(theirs), strict=True):
            assert np.array_equal(pixels(a), pixels(b))


def test_validation_accepts_plain_verl_parquet_but_training_needs_diva_columns(parquet_files, tmp_path):
    train, val, root = parquet_files
    table = pq.read_table(val).drop_columns(["question", "paraphrases", "hint_steps", "text_in_image", "difficulty"])
    plain = str(tmp_path / "plain.parquet")
    pq.write_table(table, plain)
    config = data_config([train], [plain], root / "cache")
    ds = DivaDataset(plain, None, config, processor=PROCESSOR)
    assert ds.split == "val" and ds[0]["extra_info"]["question_id"] == "v0"
    with pytest.raises(ValueError, match=r"lack the DIVA column\(s\) \['question', 'paraphrases'"):
        DivaDataset(plain, None, config, processor=PROCESSOR, split="train")


def test_question_ids_must_be_unique_and_difficulties_in_range(parquet_files, tmp_path):
    with pytest.raises(ValueError, match="'d0' appears at rows 0 and 1"):
        build(
            parquet_files, path=write_parquet(tmp_path / "dup.parquet", [make_row("d0"), make_row("d0")]), split="train"
        )
    bad = write_parquet(tmp_path / "bad.parquet", [make_row("b0", difficulty=12.0)])
    with pytest.raises(ValueError, match=r"questions \['b0'\] .* outside \[1.0, 9.0\]"):
        build(parquet_files, path=bad, split="train")


def test_difficulty_table_starts_from_the_parquet_column(parquet_files):
    ds = build(parquet_files, variants_per_question=1)
    assert ds.difficulty_table.values.tolist() == [5.0, 5.0, 5.0, 5.0, 2.0, 2.0]
    assert ds.difficulty_table.values.is_shared()


# --------------------------------------------------------------------------------------- prompts
@pytest.mark.parametrize("planner", ["paper", "released"])
def test_placeholders_always_match_images(parquet_files, planner):
    ds = build(parquet_files, variants_per_question=3, planner=planner)
    for d in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0):
        ds.difficulty_table.values.fill_(d)
        for i in range(len(ds)):
            row = ds[i]
            expected = 2 if row["extra_info"]["question_id"] in ("q4", "q5") else 1
            assert user_text(row).count("<image>") == len(images_of(row)) == expected
            assert row["prompt"] is row["raw_prompt"]


def test_text_variants_rewrite_the_question(parquet_files):
    ds = build(parquet_files, variants_per_question=1)
    ds.difficulty_table.values.fill_(5.0)
    paraphrased = ds[1]
    assert paraphrased["extra_info"]["variant_kind"] == "paraphrase"
    index = json.loads(paraphrased["extra_info"]["variant_params"])["paraphrase_index"]
    assert user_text(paraphrased).startswith(f"<image>Paraphrase {index} of question q0.")
    assert "shaded region" not in user_text(paraphrased)

    ds.difficulty_table.values.fill_(8.0)
    hinted = ds[1]
    text = user_text(hinted)
    assert hinted["extra_info"]["variant_kind"] == "hint" and HINT_HEADER in text
    assert "Step 3: Step text 2 for q0." in text and "Step text 3" not in text  # D=8: 3 of 4 steps
    assert text.startswith("<image>What is the area of the shaded region in figure q0?")


def test_question_in_image_variant(parquet_files):
    ds = build(parquet_files, variants_per_question=7)  # the paper pool of 7 image kinds covers text_in_image
    ds.difficulty_table.values.fill_(1.0)
    rows = [ds[k] for k in range(1, 8)]
    (row,) = [r for r in rows if r["extra_info"]["variant_kind"] == "text_in_image"]
    assert TEXT_IN_IMAGE_QUESTION in user_text(row) and "shaded region" not in user_text(row)
    (image,) = images_of(row)
    # The band was added (the image got taller for its width), then the whole scaled to the original's pixels.
    assert image.size[1] / image.size[0] > 48 / 64
    assert image.size[0] * image.size[1] <= 64 * 48


# ---------------------------------------------------------------------------- images and determinism
def test_image_variants_really_change_the_pixels(parquet_files):
    ds = build(parquet_files, variants_per_question=6, max_pixels=3000)
    ds.difficulty_table.values.fill_(1.0)
    original = pixels(images_of(ds[0])[0])
    seen = set()
    for k in range(1, 7):
        row = ds[k]
        name = row["extra_info"]["variant_perturbation"]
        seen.add(name)
        image = images_of(row)[0]
        assert image.size[0] * image.size[1] <= 3000
        # The variant's rebuilt messages carry the limit for the processor, as the original's do.
        assert [item["max_pixels"] for item in image_items(row["raw_prompt"])] == [3000]
        if image.size == (64, 48):
            assert np.abs(pixels(image) - original).mean() > 3.0, name
    assert len(seen) == 6


def rows_equal(a, b) -> bool:
    return (
        a["extra_info"] == b["extra_info"]
        and user_text(a) == user_text(b)
        and all(np.array_equal(pixels(x), pixels(y)) for x, y in zip(images_of(a), images_of(b), strict=True))
    )


def test_variants_are_deterministic_per_seed_epoch_question_and_slot(parquet_files):
    a, b = build(parquet_files, variants_per_question=3), build(parquet_files, variants_per_question=3)
    for ds in (a, b):
        ds.difficulty_table.values.fill_(2.0)
    for i in range(len(a)):
        assert rows_equal(a[i], b[i])
    next_epoch = [a[i + len(a)]["extra_info"]["variant_params"] for i in range(1, len(a), 4)]
    this_epoch = [a[i]["extra_info"]["variant_params"] for i in range(1, len(a), 4)]
    assert next_epoch != this_epoch
    other_seed = build(parquet_files, variants_per_question=3, seed=1)
    other_seed.difficulty_table.values.fill_(2.0)
    assert [other_seed[i]["extra_info"]["variant_params"] for i in range(1, len(a), 4)] != this_epoch


def kinds_by_slot(batch) -> list[tuple[str, int, str]]:
    return [(e["question_id"], e["variant_slot"], e["variant_kind"]) for e in batch["extra_info"]]


def test_worker_processes_perturb_and_read_the_shared_table(parquet_files):
    """Two forked workers: the table written after they started steers the plan; rows equal the main process's."""
    ds = build(parquet_files, variants_per_question=1)
    reference = build(parquet_files, variants_per_question=1)
    sampler = QuestionBlockSampler(ds, shuffle=True, seed=3)
    loader = StatefulDataLoader(
        ds, batch_size=4, sampler=sampler, num_workers=2, collate_fn=collate_fn, drop_last=True, persistent_workers=True
    )
    expected = {5.0: {"paraphrase"}, 9.0: {"hint"}, 1.0: {"image_perturb", "text_in_image"}}
    for epoch, d in enumerate((5.0, 9.0, 1.0)):
        ds.difficulty_table.values.fill_(d)  # the trainer writes; the workers (already forked) read
        reference.difficulty_table.values.fill_(d)
        batches = list(loader)
        assert len(batches) == 3
        for batch in batches:
            assert len(batch["raw_prompt"]) == 4 and isinstance(batch["extra_info"], np.ndarray)
            info = kinds_by_slot(batch)
            assert [s for _, s, _ in info] == [0, 1, 0, 1] and info[0][0] == info[1][0] and info[2][0] == info[3][0]
            assert {k for _, s, k in info if s == 1} <= expected[d]
            for k, extra in enumerate(batch["extra_info"]):
                assert extra["variant_epoch"] == epoch and extra["question_difficulty"] == d
                row = {"raw_prompt": batch["raw_prompt"][k], "extra_info": extra}
                index = epoch * len(ds) + ds.question_ids.index(extra["question_id"]) * 2 + extra["variant_slot"]
                assert rows_equal(row, reference[index])


def marker_parquet(tmp_path) -> str:
    image = np.full((60, 100, 3), 255, np.uint8)
    image[10:16, 80:86] = (255, 0, 0)  # centre (83, 13)
    row = make_row("m0", images=[png_bytes(Image.fromarray(image))], difficulty=5.0)
    return write_parquet(tmp_path / "marker.parquet", [row])


def test_rotated_variant_states_the_angle_the_marker_moved_by(parquet_files, tmp_path):
    ds = build(parquet_files, path=marker_parquet(tmp_path), split="train", planner="released", max_pixels=10**7)
    checked = 0
    for epoch in range(40):  # released D=5 -> +1: Gaussian noise or rotation; find the rotations
        row = ds[epoch * len(ds) + 1]
        if row["extra_info"]["variant_perturbation"] != "rotate":
            continue
        stated = re.search(r"rotated by (\d+) degrees (counter-clockwise|clockwise)", user_text(row))
        degrees = float(stated.group(1)) * (1 if stated.group(2) == "counter-clockwise" else -1)
        assert json.loads(row["extra_info"]["variant_params"])["perturbations"][0]["params"]["degrees"] == degrees
        (image,) = images_of(row)
        a = pixels(image)
        ys, xs = np.nonzero((a[..., 0] > 200) & (a[..., 1] < 90) & (a[..., 2] < 90))
        t = math.radians(degrees)
        # The expanded canvas of the 100 x 60 image, shrunk back to at most the original's pixels by `scale`.
        scale = image.size[0] / (100 * abs(math.cos(t)) + 60 * abs(math.sin(t)))
        dx, dy = (83 - 50) * scale, (13 - 30) * scale
        want = (
            image.size[0] / 2 + dx * math.cos(t) + dy * math.sin(t),
            image.size[1] / 2 - dx * math.sin(t) + dy * math.cos(t),
        )
        assert math.dist((xs.mean(), ys.mean()), want) < 2.0, (degrees, (xs.mean(), ys.mean()), want)
        checked += 1
    assert checked >= 5


# ------------------------------------------------------------------------------------------ bad rows
def test_truncated_image_falls_back_to_text_and_is_counted(parquet_files, tmp_path):
    good = png_bytes(picture(64, 48, seed=9))
    path = write_parquet(tmp_path / "trunc.parquet", [make_row("t0", images=[good[: len(good) // 2]], difficulty=1.0)])
    ds = build(parquet_files, path=path, split="train")
    row = ds[1]
    assert row["extra_info"]["variant_kind"] == "paraphrase"
    assert row["extra_info"]["variant_fallback"].endswith("->paraphrase:image_undecodable")
    assert ds.fallback_counts["image_undecodable"] == 1
    (item,) = [c for c in row["raw_prompt"][0]["content"] if c["type"] == "image"]
    assert item["bytes"] == good[: len(good) // 2]  # passed through as stored, like the original
    assert user_text(row).count("<image>") == 1


def test_garbage_image_and_infeasible_rows_raise_naming_the_question(parquet_files, tmp_path):
    path = write_parquet(tmp_path / "garbage.parquet", [make_row("g0", images=[b"not an image"])])
    ds = build(parquet_files, path=path, split="train")
    for index in (0, 1):
        with pytest.raises(ValueError, match="question 'g0'"):
            ds[index]
    path = write_parquet(tmp_path / "bare.parquet", [make_row("n0", images=[], paraphrases=[], hint_steps=[])])
    ds = build(parquet_files, path=path, split="train")
    assert ds[0]["extra_info"]["variant_kind"] == "original"
    with pytest.raises(ValueError, match="question 'n0': no variant kind is feasible"):
        ds[1]


def test_hard_question_without_steps_falls_back_in_worker_rows(parquet_files, tmp_path):
    path = write_parquet(tmp_path / "nohint.parquet", [make_row("h0", hint_steps=[], difficulty=9.0)])
    ds = build(parquet_files, path=path, split="train")
    row = ds[1]
    assert row["extra_info"]["variant_kind"] == "paraphrase"
    assert row["extra_info"]["variant_fallback"] == "hint->paraphrase:no_hint_steps"
    assert row["extra_info"]["variant_difficulty"] == 9.0


def test_extra_info_values_are_simple_and_params_replayable(parquet_files):
    ds = build(parquet_files, variants_per_question=3)
    ds.difficulty_table.values.fill_(1.0)
    batch = collate_fn([ds[i] for i in range(8)])
    for extra in batch["extra_info"]:
        for key in EXTRA_INFO_KEYS:
            assert isinstance(extra[key], str | int | float | bool), key
        record = json.loads(extra["variant_params"])
        assert record["kind"] == extra["variant_kind"]
    # replay: the recorded perturbation applied to the original image gives the emitted image
    from verl_ext.data.perturb import apply_perturbations

    original = images_of(ds[0])[0]
    replayed_count = 0
    for k in range(1, 4):
        row = ds[k]
        record = json.loads(row["extra_info"]["variant_params"])
        steps = [(p["name"], p["params"]) for p in record["perturbations"]]
        if record["kind"] != "image_perturb":
            continue
        replayed = apply_perturbations(original, steps, record["pixel_budgets"][0])
        assert np.array_equal(pixels(replayed), pixels(images_of(row)[0]))
        replayed_count += 1
    assert replayed_count >= 1


def test_plugged_in_through_verl_create_rl_dataset(parquet_files):
    """data.custom_cls.path=pkg://verl_ext.data.dataset, name=DivaDataset, as the recipe sets it."""
    from verl.trainer.ppo.utils import create_rl_dataset

    train, val, root = parquet_files
    config = data_config([train], [val], root / "cache", variants_per_question=3)
    config.custom_cls = {"path": "pkg://verl_ext.data.dataset", "name": "DivaDataset"}
    train_ds = create_rl_dataset(config.train_files, config, None, PROCESSOR, is_train=True)
    val_ds = create_rl_dataset(config.val_files, config, None, PROCESSOR, is_train=False)
    assert type(train_ds) is DivaDataset and type(val_ds) is DivaDataset
    assert (train_ds.split, len(train_ds), val_ds.split, len(val_ds)) == ("train", 24, "val", 3)


def test_a_batch_reads_the_difficulty_table_once(parquet_files, monkeypatch):
    """torch's fetcher calls __getitems__: one table copy per batch keeps a question's prompts on one difficulty."""
    ds = build(parquet_files, variants_per_question=1)
    ds.difficulty_table.values.fill_(2.0)
    monkeypatch.setattr(ds.difficulty_table, "read", lambda row: pytest.fail("per-item table read inside a batch"))
    rows = ds.__getitems__(list(range(4)))
    assert [r["extra_info"]["question_difficulty"] for r in rows] == [2.0] * 4
    loader = StatefulDataLoader(ds, batch_size=4, collate_fn=collate_fn)
    assert list(next(iter(loader))["extra_info"][0].keys())  # the loader goes through __getitems__ too


def test_length_filter_measures_the_longest_variant(tmp_path):
    """verl's own filter keeps both questions; DIVA drops the one whose hinted variant would not fit."""
    from recipe.diva_grpo.simulation import byte_tokenizer

    tokenizer = byte_tokenizer()  # one token per byte: lengths are easy to reason about
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    rows = [
        make_row("short", hint_steps=["Add."], paraphrases=["Sum?"], index=0),
        make_row("long", hint_steps=["x" * 400] * 4, paraphrases=["Sum?"], index=1),
    ]
    train = write_parquet(tmp_path / "train.parquet", rows)
    val = write_parquet(tmp_path / "val.parquet", [make_row("v0")])
    config = data_config([train], [val], tmp_path / "cache")
    config.filter_overlong_prompts = True
    original_length = max(len(r["prompt"][0]["content"].encode()) for r in rows)
    config.max_prompt_length = original_length + 300  # every original fits; 1,600 bytes of hints do not
    plain = RLHFDataset(train, tokenizer, config, processor=None)
    assert len(plain) == 2
    diva = DivaDataset(train, tokenizer, config, processor=None, split="train")
    assert diva.question_ids == ["short"]
    assert len(diva) == 2  # the short question's original and variant
    assert "__diva_longest_prompt" not in diva.dataframe.column_names


def test_length_filter_counts_the_image_tokens_of_the_tiny_qwen25_vl(tmp_path):
    """verl #4999 on the main job's model class: a prompt over ``data.max_prompt_length`` only once its image tokens
    are counted is dropped, with the tiny Qwen2.5-VL's own processor (84 x 84 at most: 9 image tokens), not let
    through to fail later; a prompt that fits with its image tokens is kept (the recipe's ``truncation: error``
    means verl never cuts a multimodal prompt, which breaks image features against image tokens, verl #3469, #856)."""
    from omegaconf import OmegaConf
    from transformers import AutoProcessor

    from verl_ext.cpu.tiny_model import build_tiny_vlm

    processor = AutoProcessor.from_pretrained(build_tiny_vlm(str(tmp_path / "tiny_qwen2_5_vl")))
    assert type(processor).__name__ == "Qwen2_5_VLProcessor"
    image = png_bytes(picture(84, 84))
    rows = [make_row(qid, images=[image], paraphrases=["P?"], hint_steps=["H."], index=i) for i, qid in enumerate("ab")]
    rows[0]["prompt"] = [{"role": "user", "content": "<image>" + "x" * 10}]
    rows[1]["prompt"] = [{"role": "user", "content": "<image>" + "x" * 40}]  # 30 more text tokens than row a
    train = write_parquet(tmp_path / "train.parquet", rows)
    val = write_parquet(tmp_path / "val.parquet", [make_row("v0")])
    config = data_config([train], [val], tmp_path / "cache", variants_per_question=0)
    config.filter_overlong_prompts = True

    def text_tokens(row) -> int:  # the chat-templated prompt without its image, as the tokenizer counts it
        messages = [{"role": "user", "content": row["prompt"][0]["content"].replace("<image>", "")}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return len(processor.tokenizer(text, add_special_tokens=False)["input_ids"])

    text_only = {qid: text_tokens(row) for qid, row in zip("ab", rows, strict=True)}
    # b's text fits, b's text and its 11 image tokens (start, 9 pads, end) do not; a fits with its image
    config.max_prompt_length = text_only["b"] + 5
    assert text_only["a"] + 11 <= config.max_prompt_length
    ds = DivaDataset(train, processor.tokenizer, config, processor=processor, split="train")
    assert ds.question_ids == ["a"]
    assert OmegaConf.load("recipe/diva_grpo/config/diva_grpo.yaml").data.truncation == "error"
