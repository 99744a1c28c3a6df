"""Round trip: what `diva-prep` writes passes `validate` and loads in the dataset wrapper and in verl's own dataset."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf
from prep_fixtures import png, write_jsonl
from verl.utils.dataset.rl_dataset import RLHFDataset

from data_prep.cli import main
from verl_ext.data.dataset import DivaDataset

# verl's RLHFDataset only asserts that a processor exists for image rows; the processor itself runs in the agent loop.
PROCESSOR = SimpleNamespace(image_processor=SimpleNamespace(patch_size=14))


def data_config(train, val, cache_dir):
    return OmegaConf.create(
        {
            "train_files": [str(train)],
            "val_files": [str(val)],
            "prompt_key": "prompt",
            "image_key": "images",
            "filter_overlong_prompts": False,
            "cache_dir": str(cache_dir),
            "shuffle": False,
            "diva": {"variants": {"variants_per_question": 1, "planner": "released"}},
        }
    )


def content_of(row) -> tuple[int, str]:
    parts = [c for m in row["raw_prompt"] for c in (m["content"] if isinstance(m["content"], list) else [])]
    return sum(c["type"] == "image" for c in parts), "".join(c.get("text", "") for c in parts)


@pytest.fixture()
def converted(tmp_path):
    (tmp_path / "imgs").mkdir()
    for i in range(3):
        (tmp_path / "imgs" / f"{i}.png").write_bytes(png(i + 1, size=(64, 48)))
    rows = [
        {
            "image": f"imgs/{i}.png",
            "question": f"What is {i} + {i}?",
            "answer": str(2 * i),
            "paraphrases": [f"Add {i} to {i}. What do you get?"],
            "hint_steps": [f"Take {i}.", f"Add another {i}.", "Count the total."],
            "difficulty": float(1 + 4 * i),  # 1 (easy), 5 (middling), 9 (hard)
        }
        for i in range(3)
    ]
    source = write_jsonl(tmp_path / "set.jsonl", rows)
    out = tmp_path / "train.parquet"
    assert main(["convert", "--input", str(source), "--layout", "jsonl", "--output", str(out), "--no-progress"]) == 0
    val = tmp_path / "val.parquet"
    assert main(["synth", "--output", str(val), "--n", "2", "--split", "test"]) == 0
    return out, val


def test_converted_file_validates_and_feeds_the_dataset_wrapper(converted, tmp_path):
    train, val = converted
    assert main(["validate", str(train)]) == 0
    assert main(["validate", str(val)]) == 0

    dataset = DivaDataset(
        data_files=[str(train)], tokenizer=None, processor=PROCESSOR, config=data_config(train, val, tmp_path / "c")
    )
    assert len(dataset) == 3 * 2
    # The parquet's initial difficulties reach the shared table the planner reads.
    assert dataset.difficulty_table.values.tolist() == [1.0, 5.0, 9.0]
    kinds = {}
    for index in range(len(dataset)):
        row = dataset[index]
        images, text = content_of(row)
        assert images == 1 and "<image>" not in text
        kinds[(row["extra_info"]["question_difficulty"], row["extra_info"]["variant_slot"])] = row["extra_info"][
            "variant_kind"
        ]
    # Released table: D 1 -> +8 (question drawn into the image), 5 -> +1 (image perturbation), 9 -> -5 (hints).
    assert kinds[(1.0, 0)] == kinds[(5.0, 0)] == kinds[(9.0, 0)] == "original"
    assert kinds[(1.0, 1)] == "text_in_image"
    assert kinds[(5.0, 1)] == "image_perturb"
    assert kinds[(9.0, 1)] == "hint"


def test_converted_file_loads_in_verls_plain_dataset(converted, tmp_path):
    train, val = converted
    plain = RLHFDataset(
        data_files=[str(train)], tokenizer=None, processor=PROCESSOR, config=data_config(train, val, tmp_path / "p")
    )
    assert len(plain) == 3
    images, text = content_of(plain[0])
    assert images == 1 and "What is 0 + 0?" in text
