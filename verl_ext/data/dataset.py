"""DivaDataset: verl's ``RLHFDataset`` expanded into each question's original plus ``m`` variants.

Plug it in with ``data.custom_cls.path=pkg://verl_ext.data.dataset`` and
``data.custom_cls.name=DivaDataset``; the recipe yaml sets ``data.diva: ${diva}`` so the dataset sees
the top-level ``diva:`` block (:func:`verl_ext.config.diva_config_from`; absent -> paper defaults).

Everything verl does is kept: ``RLHFDataset`` loads and filters the parquet files, builds the chat
messages (``<image>`` placeholders -> content items with PIL images) and the other fields of a row.
On top of that:

* **Layout (training set).** ``len(dataset) = N * (1 + m)`` for ``N`` question rows and
  ``m = diva.variants.variants_per_question``. Index ``i`` maps to question row
  ``q = (i % len) // (1 + m)`` and slot ``s = (i % len) % (1 + m)``; slot 0 is the original, slots
  ``1..m`` the variants. An index ``i >= len`` encodes the epoch ``e = i // len``:
  :class:`verl_ext.data.sampler.QuestionBlockSampler` adds ``e * len`` so forked DataLoader workers
  know the epoch, and each variant is a deterministic function of (``diva.variants.seed``, epoch,
  question id, slot) and the question's difficulty.
* **Difficulty.** :attr:`DivaDataset.difficulty_table` is a
  :class:`~verl_ext.difficulty.shared_table.SharedDifficultyTable` created here, in the trainer
  process before the workers fork (rows = this dataset's question rows, start = the parquet
  ``difficulty`` column where not null, else ``diva.difficulty.d_init``). The trainer writes it;
  workers only read it. The dataset never calls Ray.
* **Variants.** The planner (``diva.variants.planner``: ``paper`` or ``released``, see
  :mod:`verl_ext.data.planner`) picks each slot's variant from the question's difficulty. Text
  variants rebuild the user message with :func:`verl_ext.data.schema.build_prompt_text` (paraphrase:
  replaces the question; hint: appends the first ``n`` stored steps; rotation: the prompt states the
  angle and direction; question-in-image: the prompt asks to answer the question shown in the image);
  image variants are perturbed here, in the worker (:mod:`verl_ext.data.perturb`), the result
  limited to ``diva.variants.max_pixels``. The number of ``<image>`` placeholders always equals the
  number of images.
* **Validation set.** Never expanded or perturbed: a row is exactly ``RLHFDataset``'s plus the
  ``extra_info`` keys below (``variant_kind="original"``). Train versus validation is decided by
  :func:`resolve_split` (verl's ``create_rl_dataset`` does not tell the class).

Every row's ``extra_info`` gains (plain str/int/float so they survive collate and TransferQueue):

========================  ================================================================
key                       value
========================  ================================================================
``question_id``           the stable question id (the difficulty service's key)
``variant_kind``          ``original``, ``paraphrase``, ``hint``, ``image_perturb``, ``text_in_image``
``variant_slot``          0 for the original, ``1..m`` for the variants
``variant_epoch``         the epoch decoded from the index
``variant_difficulty``    ``clip(D + planned shift, d_min, d_max)`` (original: ``D``)
``question_difficulty``   ``D``, the question's difficulty read from the shared table
``variant_perturbation``  image transforms joined by ``+`` (``"none"`` if none)
``variant_params``        JSON record of the plan (planner, shift, paraphrase index, hint steps,
                          every perturbation with its params and seed): replays the variant
``variant_fallback``      ``""`` or ``"<planned>-><used>:<reason>"`` when the row could not
                          support the planned kind (count these for a metric)
========================  ================================================================

Bad rows: an image that cannot be decoded for perturbation (e.g. truncated bytes) or a planned kind
the row cannot support falls back to a feasible kind (recorded in ``variant_fallback`` and counted
in :attr:`DivaDataset.fallback_counts`, per worker process); a question with no feasible variant
kind, or whose image verl itself cannot open, raises ``ValueError`` naming the question id.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow.compute as pc
import torch
from PIL import Image

from verl_ext.config import diva_config_from
from verl_ext.data import file_checks, schema
from verl_ext.data.perturb import apply_perturbations
from verl_ext.data.pixel_limit import PixelLimitedDataset, image_items
from verl_ext.data.planner import ORIGINAL_PLAN, TEXT_IN_IMAGE, RowFeatures, VariantPlan, get_planner
from verl_ext.difficulty.shared_table import SharedDifficultyTable

logger = logging.getLogger(__name__)

TRAIN, VAL = "train", "val"
# The user message of a question-in-image variant (the question itself is drawn into the image).
TEXT_IN_IMAGE_QUESTION = "The question is written in the image. Read it carefully and answer it."
EXTRA_INFO_KEYS = (
    "question_id",
    "variant_kind",
    "variant_slot",
    "variant_epoch",
    "variant_difficulty",
    "question_difficulty",
    "variant_perturbation",
    "variant_params",
    "variant_fallback",
)


def resolve_split(data_files: Any, data_config: Any, split: str | None = None) -> str:
    """Decide whether a dataset is the training or the validation set.

    verl's ``create_rl_dataset`` builds both with the same ``data`` config and does not pass
    ``is_train`` on, so, in order: the explicit ``split`` argument; ``data.diva_split`` (``"train"`` or
    ``"val"``; only useful when a dataset is built by hand, because the trainer's two datasets share
    the config); otherwise ``data_files`` compared, as sets of normalised paths, with
    ``data.train_files`` and ``data.val_files``. Files that match both or neither raise ``ValueError``.
    """
    if split is None:
        split = data_config.get("diva_split", None)
    if split is not None:
        if split not in (TRAIN, VAL):
            raise ValueError(f"DivaDataset split must be '{TRAIN}' or '{VAL}', got {split!r} (data.diva_split)")
        return split
    files = file_checks.normalised_files(data_files)
    train = file_checks.normalised_files(data_config.get("train_files", None))
    val = file_checks.normalised_files(data_config.get("val_files", None))
    is_train, is_val = files == train, files == val
    if is_train and is_val:
        raise file_checks.same_files_error(files)
    if is_train:
        return TRAIN
    if is_val:
        return VAL
    raise ValueError(
        f"DivaDataset: data files {sorted(files)} are neither data.train_files ({train and sorted(train)}) nor "
        f"data.val_files ({val and sorted(val)}); pass split='train' or 'val' (or set data.diva_split)."
    )


def question_seed(question_id: str) -> int:
    """Stable 63-bit hash of a question id (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(str(question_id).encode(), digest_size=8).digest(), "little") >> 1


def _content_text(content: Any) -> str:
    """Undo ``RLHFDataset._build_messages`` on one message: content list -> text with placeholders."""
    if isinstance(content, str):
        return content
    parts = []
    for item in content:
        kind = item.get("type")
        parts.append(item["text"] if kind == "text" else f"<{kind}>")
    return "".join(parts)


LONGEST_PROMPT_COLUMN = "__diva_longest_prompt"

# Columns of the DIVA parquet format that only the dataset reads (verl_ext/data/schema.py).
DIVA_ONLY_COLUMNS = ("question", "paraphrases", "hint_steps", "text_in_image", "difficulty")


def _with_rotation_sentence(text: str, degrees: float, num_images: int) -> str:
    """The question followed by the sentence that states the rotation (positive degrees: counter-clockwise)."""
    subject = "The image has" if num_images == 1 else "Each image has"
    direction = "counter-clockwise" if degrees > 0 else "clockwise"
    return f"{text.strip()}\n{subject} been rotated by {abs(degrees):g} degrees {direction}."


def _with_last_user_text(messages: list[dict], text: str) -> list[dict]:
    """``messages`` (copies the caller owns) with the last user turn's content replaced by ``text``."""
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    messages[last_user]["content"] = text
    return messages


def _longest_variant_messages(row: dict, num_images: int, prompt_key: str, max_degrees: float) -> list[dict]:
    """``row``'s prompt rewritten as the longest text any variant of it can have (see maybe_filter_out_long_prompts)."""
    texts = [row.get("question") or ""] + list(row.get("paraphrases") or [])
    longest = _with_rotation_sentence(max(texts, key=len), max_degrees, max(1, num_images))
    user_text = schema.build_prompt_text(longest, num_images, hint_steps=list(row.get("hint_steps") or []) or None)
    return _with_last_user_text([dict(m) for m in row[prompt_key]], user_text)


def _passthrough(item: dict) -> Any:
    """The stored form of an image content item, for ``_build_messages`` to rebuild it untouched."""
    if "bytes" in item:
        return {k: v for k, v in item.items() if k not in ("type", "image")}
    return item["image"]


class DivaDataset(PixelLimitedDataset):
    """verl ``RLHFDataset`` (every image limited to ``diva.variants.max_pixels``: :mod:`verl_ext.data.pixel_limit`)
    that emits each question's original plus ``m`` difficulty-matched variants.

    Args:
        data_files, tokenizer, config, processor, max_samples: as ``RLHFDataset``; ``config.diva`` holds
            the DIVA block (``variants`` and ``difficulty`` are used here).
        split: ``"train"`` or ``"val"``; ``None`` decides with :func:`resolve_split`.
    """

    def __init__(self, data_files, tokenizer, config, processor=None, max_samples: int = -1, split=None):
        self.diva_config = diva_config_from(config.get("diva", None))
        variants = self.diva_config.variants
        self.split = resolve_split(data_files, config, split)
        self.is_train = self.split == TRAIN
        if not isinstance(variants.variants_per_question, int) or variants.variants_per_question < 0:
            raise ValueError(
                f"diva.variants.variants_per_question must be an int >= 0, got {variants.variants_per_question!r}"
            )
        self.variants_per_question = variants.variants_per_question if self.is_train else 0
        self.planner = get_planner(variants.planner)
        self.fallback_counts: Counter[str] = Counter()
        super().__init__(data_files, tokenizer, config, processor=processor, max_samples=max_samples)

    # ----------------------------------------------------------------------------------- loading
    def maybe_filter_out_long_prompts(self, dataframe=None):
        """Training: keep a question only if its longest possible variant prompt fits ``data.max_prompt_length``.

        verl measures the stored prompt, but a DIVA question also emits longer ones (a paraphrase, the rotation
        sentence, all its hint steps), and verl's agent loop refuses, rather than cuts, a multimodal prompt that is
        too long. So each row is measured, by verl's own filter, as the longest text its variants can have (an upper
        bound); variant images never have more pixels than the original, so the image tokens are the original's.
        The longest texts ride in a temporary column (no image bytes are copied); the rows kept are the originals.
        """
        needs_diva_measure = self.filter_overlong_prompts and self.is_train and self.variants_per_question > 0
        if not needs_diva_measure or dataframe is None or schema.missing_columns(dataframe.column_names):
            return super().maybe_filter_out_long_prompts(dataframe)
        images = dataframe.select_columns([self.image_key]).with_format("arrow")[:][self.image_key]
        num_images = pc.fill_null(pc.list_value_length(images), 0).to_pylist()
        text_columns = [self.prompt_key, "question", "paraphrases", "hint_steps"]
        max_degrees = max(self.diva_config.variants.rotation_degrees)
        longest = [
            _longest_variant_messages(row, n, self.prompt_key, max_degrees)
            for row, n in zip(dataframe.select_columns(text_columns), num_images, strict=True)
        ]
        measured = dataframe.add_column(LONGEST_PROMPT_COLUMN, longest)
        stored_key, self.prompt_key = self.prompt_key, LONGEST_PROMPT_COLUMN
        try:
            kept = super().maybe_filter_out_long_prompts(measured)
        finally:
            self.prompt_key = stored_key
        return kept.remove_columns(LONGEST_PROMPT_COLUMN)

    def _read_files_and_tokenize(self):
        # The launcher ran the same check before Ray started (verl_ext.data.file_checks); here it covers runs
        # started by other means and files verl copied from remote storage.
        for path in self.data_files:
            if str(path).endswith(file_checks.PARQUET_SUFFIX):
                file_checks.parquet_columns(str(path))
        super()._read_files_and_tokenize()
        self._index_questions()

    def _index_questions(self) -> None:
        """Question ids, the shared difficulty table, and (training) the DIVA columns check."""
        names = self.dataframe.column_names
        files = list(getattr(self, "original_data_files", self.data_files))
        if self.is_train:
            file_checks.check_diva_columns(names, files)
        columns = [c for c in ("extra_info", "difficulty") if c in names]
        table = self.dataframe.select_columns(columns).with_format("arrow")[:] if columns else None
        ids: list[Any] = [None] * len(self.dataframe)
        if table is not None and "extra_info" in columns:
            extra = table.column("extra_info").combine_chunks()
            if hasattr(extra.type, "get_field_index") and extra.type.get_field_index("question_id") >= 0:
                ids = extra.field("question_id").to_pylist()
        missing_ids = [row for row, qid in enumerate(ids) if qid in (None, "")]
        if missing_ids and self.is_train:
            raise ValueError(
                f"DivaDataset: rows {missing_ids[:10]} of {files} have no extra_info.question_id; every training "
                "question needs a stable id (the difficulty service keys on it)"
            )
        # Validation files may be plain verl parquet: their rows are named by position.
        self.question_ids = [f"row{row}" if qid in (None, "") else str(qid) for row, qid in enumerate(ids)]

        difficulty = self.diva_config.difficulty
        self.difficulty_table = SharedDifficultyTable(self.question_ids, initial=difficulty.d_init)
        if table is not None and "difficulty" in columns:
            stored = table.column("difficulty").to_pylist()
            rows = [row for row, d in enumerate(stored) if d is not None]
            bad = [self.question_ids[r] for r in rows if not difficulty.d_min <= stored[r] <= difficulty.d_max]
            if bad:
                raise ValueError(
                    f"DivaDataset: questions {bad[:10]} of {files} have a 'difficulty' outside "
                    f"[{difficulty.d_min}, {difficulty.d_max}] (diva.difficulty.d_min/d_max)"
                )
            self.difficulty_table.set_initial(rows, [stored[r] for r in rows])

    # ------------------------------------------------------------------------------------ layout
    @property
    def block_size(self) -> int:
        """Prompts per question: the original plus its variants (1 for validation)."""
        return 1 + self.variants_per_question

    @property
    def num_questions(self) -> int:
        return len(self.dataframe)

    def __len__(self) -> int:
        return self.num_questions * self.block_size

    def locate(self, index: int) -> tuple[int, int, int]:
        """Dataset index -> (question row, slot, epoch) (module docstring, "Layout")."""
        index = int(index)
        if index < 0:
            raise IndexError(f"DivaDataset index must be >= 0, got {index}")
        epoch, position = divmod(index, len(self))
        question_row, slot = divmod(position, self.block_size)
        return question_row, slot, epoch

    # ------------------------------------------------------------------------------------- items
    def __getitems__(self, indices: list[int]) -> list[dict]:
        """A whole batch planned from one copy of the difficulty table (torch's fetcher calls this when present).

        The trainer may write the shared table while a worker builds a batch; reading it once keeps a question's
        original and variants on the same difficulty, so ``dbar_q`` in the advantage is computed over one value.
        """
        snapshot = self.difficulty_table.values.clone()
        return [self._emit(index, snapshot) for index in indices]

    def __getitem__(self, index):
        return self._emit(index, None)

    def _emit(self, index: int, difficulties: torch.Tensor | None) -> dict:
        question_row, slot, epoch = self.locate(index)
        question_id = self.question_ids[question_row]
        try:
            row = super().__getitem__(question_row)
        except Exception as exc:
            raise ValueError(
                f"DivaDataset: question {question_id!r} (row {question_row} of {list(self.original_data_files)}) "
                f"cannot be loaded by verl's RLHFDataset: {exc!r}"
            ) from exc
        question_difficulty = (
            self.difficulty_table.read(question_row) if difficulties is None else float(difficulties[question_row])
        )
        plan = ORIGINAL_PLAN
        if slot > 0:
            plan = self._make_variant(row, question_id, slot, epoch, question_difficulty)
        d = self.diva_config.difficulty
        extra_info = dict(row.get("extra_info") or {})
        extra_info.update(
            question_id=question_id,
            variant_kind=plan.kind,
            variant_slot=slot,
            variant_epoch=epoch,
            variant_difficulty=plan.difficulty(question_difficulty, d.d_min, d.d_max),
            question_difficulty=question_difficulty,
            variant_perturbation=plan.perturbation_name,
            variant_params=json.dumps(plan.record(), sort_keys=True),
            variant_fallback=plan.fallback,
        )
        row["extra_info"] = extra_info
        # The parquet's DIVA columns were used above; they need not travel with every response through TransferQueue.
        for column in DIVA_ONLY_COLUMNS:
            row.pop(column, None)
        # Every image, original or variant, carries the resolution limit: both are built by _build_messages
        # (PixelLimitedDataset's), the original's by RLHFDataset.__getitem__, a variant's by _make_variant's rebuild.
        return row

    def _decode_images(self, items: list[dict]) -> tuple[list[Image.Image] | None, str]:
        """Fully decode every image (verl only opened them lazily); ``(None, error)`` if one fails."""
        decoded = []
        for k, item in enumerate(items):
            try:
                image = item.get("image")
                image = Image.open(image) if isinstance(image, str | os.PathLike) else image
                decoded.append(image.convert("RGB"))
            except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError, DecompressionBombError...
                return None, f"image {k}: {exc!r}"
        return decoded, ""

    def _make_variant(self, row: dict, question_id: str, slot: int, epoch: int, difficulty: float) -> VariantPlan:
        """Plan slot ``slot`` of the question and rewrite ``row``'s prompt and images in place."""
        cfg = self.diva_config.variants
        messages = row["raw_prompt"]
        items = image_items(messages)
        decoded, decode_error = self._decode_images(items) if items else ([], "")
        paraphrases = list(row.get("paraphrases") or [])
        hint_steps = list(row.get("hint_steps") or [])
        features = RowFeatures(
            num_images=len(items),
            images_decodable=decoded is not None,
            num_paraphrases=len(paraphrases),
            num_hint_steps=len(hint_steps),
            text_in_image=bool(row.get("text_in_image")),
        )
        rng = np.random.default_rng([cfg.seed, epoch, question_seed(question_id)])
        try:
            plan = self.planner(difficulty, self.variants_per_question, rng, features, cfg, self.diva_config.difficulty)
        except ValueError as exc:
            raise ValueError(f"DivaDataset: question {question_id!r}: {exc}") from exc
        plan = plan[slot - 1]
        if plan.fallback:
            self._count_fallback(plan.fallback, question_id, decode_error)

        question = row.get("question") or ""
        text = paraphrases[plan.paraphrase_index] if plan.paraphrase_index >= 0 else question
        perturbations = [(name, dict(params)) for name, params in plan.perturbations]
        if plan.kind == TEXT_IN_IMAGE:
            for name, params in perturbations:
                if name == "text_band":
                    params["text"] = text
            text = TEXT_IN_IMAGE_QUESTION
        if plan.rotation_degrees is not None:
            text = _with_rotation_sentence(text, plan.rotation_degrees, len(items))
        user_text = schema.build_prompt_text(text, len(items), hint_steps=hint_steps[: plan.hint_steps] or None)

        images, pixel_budgets = [], []
        for k, item in enumerate(items):
            if perturbations and decoded is not None:
                # Image k > 0: no text band, and its own noise (seed + k), so images do not share patterns.
                steps = [
                    (name, {**params, "seed": params["seed"] + k} if "seed" in params else params)
                    for name, params in perturbations
                    if k == 0 or name != "text_band"
                ]
                # Never more pixels than the original (a rotated canvas or a text band grows the image): a variant
                # costs no more vision tokens than the prompt verl's length filter measured.
                budget = min(cfg.max_pixels, decoded[k].width * decoded[k].height)
                pixel_budgets.append(budget)
                images.append(apply_perturbations(decoded[k], steps, budget))
            else:
                images.append(_passthrough(item))

        texts = [{"role": m["role"], "content": _content_text(m["content"])} for m in messages]
        texts = _with_last_user_text(texts, user_text)
        new_messages = self._build_messages({self.prompt_key: texts, self.image_key: images}, key=self.prompt_key)
        row["raw_prompt"] = new_messages
        row[self.prompt_key] = new_messages  # verl's row carries the same list under both keys
        # The max_pixels each perturbed image was limited to: with the perturbations, enough to replay it exactly.
        return replace(plan, extra={**plan.extra, "pixel_budgets": pixel_budgets}) if pixel_budgets else plan

    def _count_fallback(self, fallback: str, question_id: str, detail: str) -> None:
        reason = fallback.split(":", 1)[1]
        self.fallback_counts[reason] += 1
        if self.fallback_counts[reason] == 1 or detail:
            logger.warning(
                "DivaDataset (pid %d): question %r variant fell back (%s)%s; counted in extra_info.variant_fallback",
                os.getpid(),
                question_id,
                fallback,
                f": {detail}" if detail else "",
            )


__all__ = ["DivaDataset", "resolve_split", "question_seed", "EXTRA_INFO_KEYS", "TEXT_IN_IMAGE_QUESTION"]
