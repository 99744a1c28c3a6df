"""``diva-prep entropy``: each row's visual entropy under the policy's vision encoder, for Durian's perceptual buckets.

Per image (Durian, arXiv 2602.21743, Eqs. 5-9)::

    X        = the image's P patch features from the vision encoder, (P, D)
    C        = (X - mean_P X)^T (X - mean_P X) / (P - 1)       (D, D) covariance of the patch features
    p_k      = lambda_k / sum_j lambda_j                       eigenvalue shares of C
    H        = -sum_k p_k log p_k                              (0 log 0 = 0)

and a row's ``visual_entropy`` is the mean of ``H`` over its images. It is stored in ``extra_info.visual_entropy``
(:mod:`verl_ext.data.schema`), so verl's ``RLHFDataset`` and ``DivaDataset`` hand it to the trainer, where
``verl_ext.algos.compute_durian_advantage`` reads it.

* Encoder: the vision tower of a local Qwen2.5-VL or Qwen2-VL checkpoint (``--model PATH``, the policy's), built
  from its ``config.json`` with only the ``visual.*`` weights read (the language model is never loaded), run on CUDA
  when present (bfloat16), otherwise on the CPU (float32). Images are resized by the checkpoint's own image
  processor within ``--max-pixels`` (default: the DIVA dataset's ``diva.variants.max_pixels``, the resolution the
  policy sees in training).
* Features (``--features``): ``patch`` (default), the vision transformer's last hidden states, one per 14x14 patch,
  before the patch merger: the Qwen2.5-VL report calls this part the vision encoder and the merger a separate
  vision-language adapter. ``merged``: the merger's output, the visual tokens the language model reads (one per
  2x2 patches). The paper says "patch features from the vision encoder"; which of the two it took is not stated.
* The eigenvalues are those of ``C``, computed as the squared singular values of the centred ``X`` over ``P - 1``, in
  float64 (the nonzero eigenvalues are the same; no ``D x D`` matrix is formed). A single patch, or patches that
  are all equal (``C = 0``), give ``H = 0``.
* Resumable: each row's result is appended to a cache (:class:`data_prep.cache.ResultCache`, keyed by row index and
  the hash of the row's image bytes, in a file per model fingerprint and setting) as soon as it is computed; a
  killed run resumes where it stopped. A row without an image, or with an image that has no bytes or does not
  decode, goes to the quarantine file with its reason and is left out of the output; the command fails, writing
  no output, when the bad fraction exceeds ``--max-bad-fraction``. The output is written atomically
  (:class:`data_prep.parquet_io.DivaParquetWriter`): every input column kept, ``extra_info.visual_entropy`` set.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image, UnidentifiedImageError
from tqdm import tqdm

from data_prep.cache import ResultCache, content_hash
from data_prep.errors import PrepError
from data_prep.parquet_io import DivaParquetWriter, iter_parquet_batches, num_rows, open_parquet
from data_prep.quarantine import BadRow, Quarantine
from verl_ext.config import VariantConfig
from verl_ext.data.schema import missing_columns

# Bump when the computation changes: the cache file is keyed on it, so old results are not reused.
ENTROPY_VERSION = 1
TASK = "visual_entropy"
FEATURES = ("patch", "merged")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SUPPORTED_MODEL_TYPES = ("qwen2_5_vl", "qwen2_vl")
# Checkpoint key prefixes of the vision tower: the released Qwen checkpoints use "visual.", some re-saved ones
# (transformers' newer module layout) "model.visual.".
VISION_PREFIXES = ("visual.", "model.visual.")
# Rows decoded and preprocessed ahead on the thread pool: bounds memory to a few rows of pixel tensors.
CHUNK_ROWS = 8


@dataclass
class EntropyOptions:
    model: Path
    device: str = "auto"  # "auto": cuda when available, else cpu
    dtype: str = "auto"  # "auto": bfloat16 on cuda, float32 on cpu
    features: str = "patch"  # "patch" or "merged" (module docstring)
    max_pixels: int = VariantConfig.max_pixels  # per image, as the DIVA dataset limits every image
    min_pixels: int | None = None  # default: the checkpoint's image processor's
    cache_dir: Path | None = None  # default: <output>.cache/
    quarantine_path: Path | None = None  # default: <output stem>.quarantine.jsonl
    max_bad_fraction: float = 0.0
    workers: int | None = None  # image decoding / preprocessing threads (default: cores, max 4)
    progress: bool = True


@dataclass
class EntropySummary:
    output: Path
    quarantine: Path
    cache_path: Path | None = None
    device: str = ""
    features: str = ""
    rows_in: int = 0
    rows_written: int = 0
    bad_rows: int = 0
    reasons: Counter = field(default_factory=Counter)
    from_cache: int = 0
    computed: int = 0
    entropy_min: float = float("nan")
    entropy_max: float = float("nan")
    elapsed_s: float = 0.0
    failed: bool = False
    max_bad_fraction: float = 0.0

    @property
    def bad_fraction(self) -> float:
        return self.bad_rows / self.rows_in if self.rows_in else 0.0

    def format(self) -> str:
        lines = [
            f"rows read: {self.rows_in}, written: {self.rows_written}, quarantined: {self.bad_rows}; "
            f"computed: {self.computed}, from cache: {self.from_cache}; {self.elapsed_s:.1f} s on {self.device}",
            f"visual_entropy ({self.features} features): min {self.entropy_min:.4f}, max {self.entropy_max:.4f}",
            f"cache: {self.cache_path}",
        ]
        for reason, count in self.reasons.most_common():
            lines.append(f"  {count:6d}  {reason}")
        if self.bad_rows:
            lines.append(f"quarantine file (row index and reason per line): {self.quarantine}")
        if self.failed:
            lines.append(
                f"FAILED: bad fraction {self.bad_fraction:.4f} exceeds --max-bad-fraction {self.max_bad_fraction}; "
                f"{self.output} was not written. Fix the rows listed in the quarantine file, or raise "
                "--max-bad-fraction to accept dropping them (computed rows come from the cache on the rerun)."
            )
        else:
            lines.append(f"wrote {self.output}")
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ the math
def spectral_entropy(features: torch.Tensor) -> float:
    """``H = -sum_k p_k log p_k`` over the eigenvalue shares of the covariance of ``features: (P, D)``.

    The covariance ``X_c^T X_c / (P - 1)`` has the squared singular values of the centred ``X_c`` over ``P - 1`` as
    its nonzero eigenvalues (its other ``D - rank`` eigenvalues are 0 and add nothing to ``H``), computed in float64.
    One patch, or a zero covariance, gives 0.
    """
    x = features.detach().to(torch.float64)
    patches = x.shape[0]
    if patches < 2:
        return 0.0
    centred = x - x.mean(dim=0, keepdim=True)
    eigenvalues = torch.linalg.svdvals(centred).square() / (patches - 1)
    total = eigenvalues.sum()
    if not bool(total > 0):
        return 0.0
    shares = eigenvalues / total
    return float(-torch.xlogy(shares, shares).sum())


# --------------------------------------------------------------------------------------------- the encoder
class VisionEncoder:
    """The vision tower of a local Qwen2.5-VL / Qwen2-VL checkpoint, with its image processor.

    Only the vision weights are read from the checkpoint's safetensors files; the tower is built from
    ``config.json``'s ``vision_config``. ``features(images)`` returns one ``(P, D)`` tensor per image.
    """

    def __init__(
        self,
        model_path: str | Path,
        device: str = "auto",
        dtype: str = "auto",
        features: str = "patch",
        max_pixels: int | None = VariantConfig.max_pixels,
        min_pixels: int | None = None,
    ):
        from transformers import AutoConfig, AutoImageProcessor

        self.model_path = Path(model_path)
        if not (self.model_path / "config.json").is_file():
            raise PrepError(
                f"--model {str(model_path)!r} is not a local checkpoint folder with a config.json; download the "
                "policy model first (e.g. `hf download Qwen/Qwen2.5-VL-7B-Instruct --local-dir PATH`)"
            )
        if features not in FEATURES:
            raise PrepError(f"--features must be one of {list(FEATURES)}, got {features!r}")
        self.features_kind = features
        self.device = _resolve_device(device)
        self.dtype = _resolve_dtype(dtype, self.device)
        config = AutoConfig.from_pretrained(self.model_path)
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise PrepError(
                f"--model {str(model_path)!r} is a {config.model_type!r} checkpoint; the entropy command supports "
                f"{list(SUPPORTED_MODEL_TYPES)} (the policy's vision encoder)"
            )
        try:
            self.processor = AutoImageProcessor.from_pretrained(self.model_path)
        except (OSError, ValueError) as exc:
            raise PrepError(f"--model {str(model_path)!r}: cannot load its image processor ({exc})") from None
        size = dict(self.processor.size)
        self.size = {
            "shortest_edge": int(min_pixels or size["shortest_edge"]),
            "longest_edge": int(max_pixels or size["longest_edge"]),
        }
        if self.size["shortest_edge"] > self.size["longest_edge"]:
            raise PrepError(
                f"--min-pixels {self.size['shortest_edge']} exceeds --max-pixels {self.size['longest_edge']}"
            )
        self.model = self._load_tower(config)
        self.merge_unit = int(config.vision_config.spatial_merge_size) ** 2

    def _load_tower(self, config) -> torch.nn.Module:
        from transformers.initialization import no_init_weights

        if config.model_type == "qwen2_5_vl":
            from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
                Qwen2_5_VisionTransformerPretrainedModel as Tower,
            )
        else:
            from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel as Tower
        state = _vision_state_dict(self.model_path)
        with no_init_weights():  # every parameter is loaded below: skip the random initialisation
            tower = Tower._from_config(config.vision_config, dtype=self.dtype)
        missing, unexpected = tower.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise PrepError(
                f"--model {str(self.model_path)!r}: the vision weights do not match its vision_config "
                f"(missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]})"
            )
        return tower.to(device=self.device, dtype=self.dtype).eval()

    def preprocess(self, images: list[Image.Image]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(pixel_values, image_grid_thw)`` of the images, as the policy's processor makes them (CPU tensors)."""
        out = self.processor(images=images, size=self.size, return_tensors="pt")
        return out["pixel_values"], out["image_grid_thw"]

    @torch.no_grad()
    def features(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> list[torch.Tensor]:
        """One ``(P, D)`` feature tensor per image (all the images of a row go through the tower in one call)."""
        out = self.model(pixel_values.to(self.device, self.dtype), grid_thw=grid_thw.to(self.device))
        patches = grid_thw.prod(dim=-1)
        if self.features_kind == "patch":
            # The hidden states are in the tower's window order, but within each image: a permutation of its
            # patches, which the covariance does not see.
            return list(out.last_hidden_state.split(patches.tolist()))
        return list(out.pooler_output.split((patches // self.merge_unit).tolist()))

    def entropy(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> float:
        """Mean of :func:`spectral_entropy` over the images."""
        values = [spectral_entropy(x) for x in self.features(pixel_values, grid_thw)]
        return sum(values) / len(values)

    def fingerprint(self) -> dict:
        """What the cache keys on: the checkpoint (config, processor, weight files) and the settings."""
        files = sorted(self.model_path.glob("*.safetensors")) + [self.model_path / "config.json"]
        stats = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]
        processor = self.model_path / "preprocessor_config.json"
        return {
            "task": TASK,
            "version": ENTROPY_VERSION,
            "model": str(self.model_path.resolve()),
            "checkpoint": content_hash(json.dumps(stats), processor.read_text() if processor.is_file() else ""),
            "features": self.features_kind,
            "dtype": str(self.dtype).removeprefix("torch."),
            "size": self.size,
        }


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise PrepError(f"--device {device!r} is not a torch device ({exc})") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise PrepError(f"--device {device!r}: CUDA is not available on this machine (use --device cpu)")
    return resolved


def _resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise PrepError(f"--dtype must be auto or one of {list(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def _vision_state_dict(model_path: Path) -> dict[str, torch.Tensor]:
    """The vision tower's weights, prefixes stripped, read from only the shards that hold them."""
    from safetensors import safe_open

    index = model_path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({model_path / name for key, name in weight_map.items() if _vision_key(key) is not None})
    else:
        files = sorted(model_path.glob("*.safetensors"))
    state = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (a safetensors handle is not a dict)
                stripped = _vision_key(key)
                if stripped is not None:
                    state[stripped] = handle.get_tensor(key)
    if not state:
        raise PrepError(
            f"--model {str(model_path)!r} holds no vision weights (keys starting with {list(VISION_PREFIXES)} in "
            "*.safetensors files)"
        )
    return state


def _vision_key(key: str) -> str | None:
    for prefix in VISION_PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix) :]
    return None


# -------------------------------------------------------------------------------------------------- the rows
def decode_images(row: dict) -> list[Image.Image]:
    """The row's images as RGB PIL images; :class:`BadRow` with the reason when there is none or one is broken."""
    cells = row.get("images") or []
    if not cells:
        raise BadRow("no image: the visual entropy needs at least one image")
    images = []
    for k, cell in enumerate(cells):
        data = cell.get("bytes") if isinstance(cell, dict) else None
        if not data:
            raise BadRow(f"broken image: image {k} has no bytes")
        try:
            with Image.open(io.BytesIO(data)) as image:
                images.append(image.convert("RGB"))  # convert() loads every pixel: a truncated file fails here
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
            raise BadRow(f"undecodable image: image {k}: {type(exc).__name__}: {exc}") from None
    return images


def images_hash(row: dict) -> str:
    """The cache's content hash of a row: its image bytes (an edited row is computed afresh)."""
    cells = row.get("images") or []
    digests = [hashlib.sha256(cell.get("bytes") or b"").hexdigest() if isinstance(cell, dict) else "" for cell in cells]
    return content_hash(*digests)


def _prepare(item: tuple[int, dict], encoder: VisionEncoder, cache: ResultCache) -> tuple[Any, ...]:
    """On the thread pool: ``("cached", value)``, ``("bad", reason)`` or ``("compute", hash, pixel_values, grid)``."""
    index, row = item
    hash_ = images_hash(row)
    cached = cache.get(str(index), TASK, hash_)
    if cached is not None:
        return ("cached", cached["visual_entropy"])
    try:
        images = decode_images(row)
    except BadRow as exc:
        return ("bad", str(exc))
    try:
        pixel_values, grid = encoder.preprocess(images)
    except (ValueError, RuntimeError) as exc:  # e.g. an aspect ratio beyond the processor's limit
        return ("bad", f"image cannot be preprocessed: {type(exc).__name__}: {exc}")
    return ("compute", hash_, pixel_values, grid)


def run_entropy(input_path: str | Path, output: str | Path, options: EntropyOptions) -> EntropySummary:
    """Fill ``extra_info.visual_entropy`` of every row of ``input_path`` (a DIVA parquet) and write ``output``."""
    input_path, output = Path(input_path), Path(output)
    if not input_path.is_file():
        raise PrepError(f"--input {str(input_path)!r} is not a file")
    if input_path.resolve() == output.resolve():
        raise PrepError("--output must differ from --input (the input is read while the output is written)")
    missing = missing_columns(open_parquet(input_path).schema_arrow.names)
    if missing:
        raise PrepError(f"--input {str(input_path)!r} is not a DIVA parquet: missing columns {missing} (run convert)")
    if not 0.0 <= options.max_bad_fraction <= 1.0:
        raise PrepError(f"--max-bad-fraction must be in [0, 1], got {options.max_bad_fraction}")
    quarantine_path = Path(options.quarantine_path or output.with_name(output.stem + ".quarantine.jsonl"))
    summary = EntropySummary(output=output, quarantine=quarantine_path, max_bad_fraction=options.max_bad_fraction)
    total = num_rows(input_path)
    if total == 0:
        raise PrepError(f"--input {str(input_path)!r} holds no rows")

    started = time.perf_counter()
    encoder = VisionEncoder(
        options.model, options.device, options.dtype, options.features, options.max_pixels, options.min_pixels
    )
    summary.device, summary.features = str(encoder.device), encoder.features_kind
    cache = ResultCache(options.cache_dir or output.with_name(output.name + ".cache"), encoder.fingerprint())
    summary.cache_path = cache.path
    workers = options.workers or min(4, os.cpu_count() or 1)
    values: list[float] = []
    try:
        with (
            Quarantine(quarantine_path) as quarantine,
            DivaParquetWriter(output) as writer,
            ThreadPoolExecutor(max_workers=workers) as pool,
            tqdm(total=total, desc="entropy", unit="row", disable=not options.progress) as bar,
        ):
            batches = iter_parquet_batches(input_path, batch_size=CHUNK_ROWS)
            chunks = (
                list(enumerate(rows, start=first)) for first, rows in zip(itertools.count(0, CHUNK_ROWS), batches)
            )

            def submit(chunk: list[tuple[int, dict]]) -> list:
                return [(item, pool.submit(_prepare, item, encoder, cache)) for item in chunk]

            # One chunk ahead: the threads decode and preprocess the next rows while the encoder runs on these.
            pending = submit(next(chunks, []))
            while pending:
                following = submit(next(chunks, []))
                for (index, row), future in pending:
                    result = future.result()
                    summary.rows_in += 1
                    if result[0] == "bad":
                        extra = row.get("extra_info") or {}
                        quarantine.add(index, result[1], question_id=extra.get("question_id"))
                        continue
                    if result[0] == "cached":
                        value = result[1]
                        summary.from_cache += 1
                    else:
                        _, hash_, pixel_values, grid = result
                        value = encoder.entropy(pixel_values, grid)
                        cache.put(str(index), TASK, hash_, {"visual_entropy": value})
                        summary.computed += 1
                    row["extra_info"] = {**(row.get("extra_info") or {}), "visual_entropy": value}
                    values.append(value)
                    writer.write(row)
                bar.update(len(pending))
                bar.set_postfix(bad=quarantine.count, cached=summary.from_cache, refresh=False)
                pending = following
            summary.bad_rows, summary.reasons = quarantine.count, quarantine.reasons
            if summary.bad_fraction > options.max_bad_fraction or summary.bad_rows == summary.rows_in:
                summary.failed = True  # leaving the writer without commit removes the temporary output
            else:
                writer.commit()
                summary.rows_written = writer.rows_written
    finally:
        cache.close()
    if values:
        summary.entropy_min, summary.entropy_max = min(values), max(values)
    summary.elapsed_s = time.perf_counter() - started
    return summary
