"""`diva-prep entropy` on a tiny, randomly initialised Qwen2.5-VL (and Qwen2-VL) saved locally: the stored H against
a slow numpy reference computed through transformers' own full model, several images -> mean, quarantine, resume
after a kill, and the column reaching extra_info through verl's dataset and DivaDataset."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image
from prep_fixtures import diva_rows_without_variants, png, write_diva
from verl.utils.dataset.rl_dataset import RLHFDataset

from data_prep import entropy as entropy_module
from data_prep.cli import main
from data_prep.entropy import EntropyOptions, run_entropy, spectral_entropy
from verl_ext.data.dataset import DivaDataset
from verl_ext.data.schema import SCHEMA, build_prompt

MAX_PIXELS = 112 * 112  # 64 patches of 14x14 per image at most: tiny and fast
PROCESSOR = SimpleNamespace(image_processor=SimpleNamespace(patch_size=14))


def _tiny_checkpoint(folder, model_type: str):
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
    )
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    text = dict(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]},
    )
    torch.manual_seed(0)
    if model_type == "qwen2_5_vl":
        vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=16)
        vision |= dict(window_size=56, fullatt_block_indexes=[1])
        model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision))
    else:
        vision = dict(depth=2, embed_dim=32, hidden_size=16, mlp_ratio=2, num_heads=2)
        model = Qwen2VLForConditionalGeneration(Qwen2VLConfig(text_config=text, vision_config=vision))
    model.save_pretrained(folder)
    Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=28 * 28 * 1280).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return _tiny_checkpoint(tmp_path_factory.mktemp("tiny_qwen25vl"), "qwen2_5_vl")


def reference_entropy(checkpoint, image_bytes: list[bytes], features: str = "patch") -> float:
    """Slow and independent: transformers' full model as from_pretrained loads it, numpy covariance, eigvalsh."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32).eval()
    processor = AutoImageProcessor.from_pretrained(checkpoint)
    values = []
    for data in image_bytes:
        image = Image.open(io.BytesIO(data)).convert("RGB")
        inputs = processor(images=[image], size={"shortest_edge": 56 * 56, "longest_edge": MAX_PIXELS})
        with torch.no_grad():
            out = model.model.visual(
                torch.as_tensor(inputs["pixel_values"]), grid_thw=torch.as_tensor(inputs["image_grid_thw"])
            )
        x = (out.last_hidden_state if features == "patch" else out.pooler_output).double().numpy()
        covariance = np.cov(x, rowvar=False)  # 1 / (P - 1)
        assert covariance.shape == (x.shape[1], x.shape[1])
        eigenvalues = np.clip(np.linalg.eigvalsh(covariance), 0.0, None)
        shares = eigenvalues / eigenvalues.sum()
        values.append(float(-sum(p * np.log(p) for p in shares if p > 0)))
    return sum(values) / len(values)


def _rows(n: int = 5) -> list[dict]:
    rows = diva_rows_without_variants(n)
    # Row 1 has two images: its H is their mean.
    rows[1]["images"] = [rows[1]["images"][0], {"bytes": png(9, size=(90, 60)), "path": ""}]
    rows[1]["prompt"] = build_prompt(rows[1]["question"], 2)
    return rows


def _options(checkpoint, tmp_path, **kw) -> EntropyOptions:
    return EntropyOptions(model=checkpoint, device="cpu", max_pixels=MAX_PIXELS, progress=False, **kw)


def _entropies(path) -> list[float]:
    return [row["visual_entropy"] for row in pq.read_table(path).column("extra_info").to_pylist()]


def test_spectral_entropy_matches_numpy_on_random_features():
    rng = np.random.default_rng(0)
    for patches, dim in ((2, 5), (7, 3), (40, 40), (100, 8)):
        x = rng.normal(size=(patches, dim)) * rng.uniform(0.1, 3.0, size=dim)
        eig = np.clip(np.linalg.eigvalsh(np.cov(x, rowvar=False)), 0, None)
        shares = eig / eig.sum()
        expected = -sum(p * np.log(p) for p in shares if p > 0)
        assert spectral_entropy(torch.from_numpy(x).float()) == pytest.approx(expected, rel=1e-5)
    assert spectral_entropy(torch.ones(5, 4)) == 0.0  # zero covariance
    assert spectral_entropy(torch.randn(1, 4)) == 0.0  # one patch
    # Isotropic in k directions: H = log k.
    basis = torch.cat([torch.eye(3), -torch.eye(3)]).double()
    assert spectral_entropy(torch.cat([basis, torch.zeros(6, 2, dtype=torch.float64)], dim=1)) == pytest.approx(
        np.log(3)
    )


@pytest.mark.parametrize("features", ["patch", "merged"])
def test_entropy_matches_the_numpy_reference_and_averages_images(checkpoint, tmp_path, features):
    rows = _rows(3)
    source = write_diva(tmp_path / "in.parquet", rows)
    summary = run_entropy(source, tmp_path / "out.parquet", _options(checkpoint, tmp_path, features=features))
    assert not summary.failed and summary.rows_written == 3 and summary.computed == 3
    stored = _entropies(tmp_path / "out.parquet")
    for row, value in zip(rows, stored, strict=True):
        expected = reference_entropy(checkpoint, [image["bytes"] for image in row["images"]], features)
        assert value == pytest.approx(expected, rel=1e-5, abs=1e-6)
    two = [reference_entropy(checkpoint, [image["bytes"]], features) for image in rows[1]["images"]]
    assert two[0] != pytest.approx(two[1])  # the mean is not trivially one of them
    assert stored[1] == pytest.approx(sum(two) / 2, rel=1e-5)
    # Every other column is carried over unchanged.
    before, after = pq.read_table(source).to_pylist(), pq.read_table(tmp_path / "out.parquet").to_pylist()
    for old, new in zip(before, after, strict=True):
        assert {k: v for k, v in old.items() if k != "extra_info"} == {
            k: v for k, v in new.items() if k != "extra_info"
        }
        assert {k: v for k, v in new["extra_info"].items() if k != "visual_entropy"} == {
            k: v for k, v in old["extra_info"].items() if k != "visual_entropy"
        }
        assert old["extra_info"]["visual_entropy"] is None


def test_bad_rows_are_quarantined_and_left_out(checkpoint, tmp_path):
    rows = _rows(6)
    rows[2]["images"] = []
    rows[3]["images"] = [{"bytes": b"not an image", "path": ""}]
    rows[4]["images"] = [rows[4]["images"][0], {"bytes": png(3)[:40], "path": ""}]  # a truncated second image
    source = write_diva(tmp_path / "in.parquet", rows)
    out = tmp_path / "out.parquet"

    summary = run_entropy(source, out, _options(checkpoint, tmp_path))
    assert summary.failed and not out.exists() and not out.with_name(out.name + ".tmp").exists()
    quarantined = [json.loads(line) for line in summary.quarantine.read_text().splitlines()]
    assert [record["row"] for record in quarantined] == [2, 3, 4]
    assert quarantined[0]["reason"].startswith("no image")
    assert quarantined[1]["reason"].startswith("undecodable image: image 0")
    assert quarantined[2]["reason"].startswith("undecodable image: image 1")
    assert quarantined[0]["question_id"] == rows[2]["extra_info"]["question_id"]

    summary = run_entropy(source, out, _options(checkpoint, tmp_path, max_bad_fraction=0.5))
    assert not summary.failed and summary.rows_written == 3 and summary.from_cache == 3 and summary.computed == 0
    ids = [row["question_id"] for row in pq.read_table(out).column("extra_info").to_pylist()]
    assert ids == [rows[i]["extra_info"]["question_id"] for i in (0, 1, 5)]
    assert summary.bad_rows == 3 and "quarantined: 3" in summary.format()


def test_a_killed_run_resumes_from_its_cache(checkpoint, tmp_path, monkeypatch):
    rows = _rows(5)
    source = write_diva(tmp_path / "in.parquet", rows)
    clean = run_entropy(source, tmp_path / "clean.parquet", _options(checkpoint, tmp_path, cache_dir=tmp_path / "c1"))
    assert clean.computed == 5

    out = tmp_path / "out.parquet"
    real = entropy_module.VisionEncoder.entropy
    calls = []

    def killed_after_two(self, pixel_values, grid):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(1)
        return real(self, pixel_values, grid)

    monkeypatch.setattr(entropy_module.VisionEncoder, "entropy", killed_after_two)
    with pytest.raises(KeyboardInterrupt):
        run_entropy(source, out, _options(checkpoint, tmp_path))
    assert not out.exists() and not out.with_name(out.name + ".tmp").exists()  # nothing that looks finished
    monkeypatch.setattr(entropy_module.VisionEncoder, "entropy", real)

    resumed = run_entropy(source, out, _options(checkpoint, tmp_path))
    assert (resumed.from_cache, resumed.computed) == (2, 3)
    assert _entropies(out) == pytest.approx(_entropies(tmp_path / "clean.parquet"), rel=1e-6)
    again = run_entropy(source, out, _options(checkpoint, tmp_path))
    assert (again.from_cache, again.computed) == (5, 0)

    # A different setting is a different cache file; an edited image invalidates only its row.
    same_folder = out.with_name(out.name + ".cache")  # the default cache folder of the runs above
    merged = run_entropy(
        source, tmp_path / "m.parquet", _options(checkpoint, tmp_path, features="merged", cache_dir=same_folder)
    )
    assert merged.computed == 5 and merged.cache_path != again.cache_path
    rows[0]["images"] = [{"bytes": png(30), "path": ""}]
    write_diva(source, rows)
    edited = run_entropy(source, out, _options(checkpoint, tmp_path))
    assert (edited.from_cache, edited.computed) == (4, 1)


def test_column_reaches_extra_info_through_verls_dataset_and_diva_dataset(checkpoint, tmp_path):
    source = write_diva(tmp_path / "in.parquet", _rows(3))
    out = tmp_path / "train.parquet"
    command = ["entropy", "--model", str(checkpoint), "--input", str(source), "--output", str(out)]
    assert main([*command, "--device", "cpu", "--max-pixels", str(MAX_PIXELS), "--no-progress"]) == 0
    assert main(["validate", str(out)]) == 0
    assert pq.read_schema(out).equals(SCHEMA)
    stored = _entropies(out)
    assert all(isinstance(value, float) and value > 0 for value in stored)

    val = write_diva(tmp_path / "val.parquet", _rows(2))
    config = OmegaConf.create(
        {
            "train_files": [str(out)],
            "val_files": [str(val)],
            "prompt_key": "prompt",
            "image_key": "images",
            "filter_overlong_prompts": False,
            "cache_dir": str(tmp_path / "hf"),
            "shuffle": False,
            "diva": {"variants": {"variants_per_question": 1, "planner": "released"}},
        }
    )
    plain = RLHFDataset(data_files=[str(out)], tokenizer=None, processor=PROCESSOR, config=config)
    assert [plain[i]["extra_info"]["visual_entropy"] for i in range(3)] == stored
    diva = DivaDataset(data_files=[str(out)], tokenizer=None, processor=PROCESSOR, config=config)
    # The original and its variant carry their question's entropy.
    assert [diva[i]["extra_info"]["visual_entropy"] for i in range(6)] == [v for v in stored for _ in range(2)]


def test_qwen2_vl_checkpoints_work_too(tmp_path):
    checkpoint = _tiny_checkpoint(tmp_path / "tiny_qwen2vl", "qwen2_vl")
    rows = _rows(2)
    source = write_diva(tmp_path / "in.parquet", rows)
    summary = run_entropy(source, tmp_path / "out.parquet", _options(checkpoint, tmp_path))
    assert summary.rows_written == 2
    for row, value in zip(rows, _entropies(tmp_path / "out.parquet"), strict=True):
        expected = reference_entropy(checkpoint, [image["bytes"] for image in row["images"]])
        assert value == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_vision_weights_saved_under_either_prefix_load(checkpoint, tmp_path):
    """Released Qwen checkpoints name the tower 'visual.*'; re-saved ones may say 'model.visual.*' (and shard)."""
    from safetensors.torch import load_file, save_file

    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for name in ("config.json", "preprocessor_config.json"):
        (renamed / name).write_bytes((checkpoint / name).read_bytes())
    state = load_file(str(checkpoint / "model.safetensors"))
    vision = {f"model.{k}": v for k, v in state.items() if k.startswith("visual.")}
    other = {k: v for k, v in state.items() if not k.startswith("visual.")}
    save_file(vision, str(renamed / "model-00002-of-00002.safetensors"))
    save_file(other, str(renamed / "model-00001-of-00002.safetensors"))
    weight_map = {k: "model-00002-of-00002.safetensors" for k in vision} | {
        k: "model-00001-of-00002.safetensors" for k in other
    }
    (renamed / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    source = write_diva(tmp_path / "in.parquet", _rows(2))
    first = run_entropy(source, tmp_path / "a.parquet", _options(checkpoint, tmp_path))
    second = run_entropy(source, tmp_path / "b.parquet", _options(renamed, tmp_path))
    assert first.computed == second.computed == 2
    assert _entropies(tmp_path / "a.parquet") == _entropies(tmp_path / "b.parquet")


def test_unusable_arguments_exit_with_status_2(checkpoint, tmp_path, capsys):
    source = write_diva(tmp_path / "in.parquet", _rows(2))
    base = ["entropy", "--input", str(source), "--output", str(tmp_path / "o.parquet"), "--no-progress"]
    assert main([*base, "--model", str(tmp_path / "nowhere")]) == 2
    assert "not a local checkpoint folder" in capsys.readouterr().err
    assert main([*base, "--model", str(checkpoint), "--dtype", "float8"]) == 2
    assert "--dtype" in capsys.readouterr().err
    assert main([*base, "--model", str(checkpoint), "--max-bad-fraction", "2"]) == 2
    not_diva = tmp_path / "plain.parquet"
    pq.write_table(pq.read_table(source).drop_columns(["question"]), not_diva)
    assert main(["entropy", "--model", str(checkpoint), "--input", str(not_diva), "--output", str(tmp_path / "x")]) == 2
    assert "not a DIVA parquet" in capsys.readouterr().err
