"""A supervised warm start of the tiny CPU model on the swatch task (:mod:`data_prep.swatch`), stopped early.

A random policy never writes ``\\boxed{}``: every reward is 0 and GRPO learns nothing. The paper starts from a
base model that half-solves its data; this pass makes the tiny model such a base: it teaches the answer format
(``<think>colour</think>\\boxed{n}``) and part of the colour-to-number mapping, then stops as soon as the greedy
validation accuracy (the project's reward, :func:`verl_ext.reward.compute_score`) reaches ``target`` (default
0.3), between the issue's 20% and 60%: prompt groups neither always right nor always wrong.

Why a few lines of transformers and not verl's SFT trainer: verl 0.9.1's SFT trainer is a torchrun/FSDP job over
text-only chat parquet with no processor path for images in its multi-turn dataset, and it has no hook to stop on
a validation accuracy. Here the model is loaded, fed and saved exactly as verl's workers load it
(``AutoModelForImageTextToText`` on the same folder, the same processor and chat template, so the same prompt
tokens and image patches as the agent loop builds), in about a minute on 2 cores.

The training examples are every training row as asked (original), with a paraphrase, and with 1, 2 or 3 of its
hint steps, so that the warm policy also reads hints as a base model does; validation rows are originals.
Seeded from ``seed`` (example order, initial weights of nothing: the model folder's own weights are the start).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
import time

import pandas as pd

from verl_ext.data.schema import IMAGE_PLACEHOLDER, build_prompt_text

STATE_FILE = "warm_start.json"
DATA_SOURCE = "diva_swatch"
MAX_NEW_TOKENS = 32


class WarmStartError(RuntimeError):
    """The warm start could not bring the tiny model into its target accuracy band (the message says why)."""


def _colour_of(answer: str) -> str:
    from data_prep.swatch import PALETTE

    for name, _, number in PALETTE:
        if number == answer:
            return name
    raise WarmStartError(f"ground truth {answer!r} is not a swatch answer ({[n for _, _, n in PALETTE]})")


def _image(row) -> object:
    import io

    from PIL import Image

    return Image.open(io.BytesIO(row["images"][0]["bytes"])).convert("RGB")


def examples_of(rows: pd.DataFrame, with_variants: bool) -> list[dict]:
    """``{"text", "image", "answer", "target"}`` per example: the user text as verl's datasets build it."""
    from data_prep.swatch import answer_text

    out = []
    for _, row in rows.iterrows():
        answer = row["reward_model"]["ground_truth"]
        base = {"image": _image(row), "answer": answer, "target": answer_text(_colour_of(answer))}
        texts = [build_prompt_text(row["question"], 1)]
        if with_variants:
            texts += [build_prompt_text(p, 1) for p in row["paraphrases"][:1]]
            steps = list(row["hint_steps"])
            texts += [build_prompt_text(row["question"], 1, hint_steps=steps[:k]) for k in range(1, len(steps) + 1)]
        out += [{**base, "text": text} for text in texts]
    return out


def _chat(processor, text: str) -> str:
    parts = [p for p in re.split(f"({re.escape(IMAGE_PLACEHOLDER)})", text) if p]
    content = [{"type": "image"} if p == IMAGE_PLACEHOLDER else {"type": "text", "text": p} for p in parts]
    return processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)


def _inputs(processor, example: dict, with_target: bool):
    prompt = _chat(processor, example["text"])
    text = prompt + example["target"] + processor.tokenizer.eos_token if with_target else prompt
    batch = processor(text=[text], images=[example["image"]], return_tensors="pt")
    prompt_len = len(processor(text=[prompt], images=[example["image"]])["input_ids"][0])
    return batch, prompt_len


def greedy_accuracy(model, processor, examples: list[dict], batch_size: int = 16) -> float:
    """Fraction of ``examples`` answered correctly (greedy, :data:`MAX_NEW_TOKENS`) by the project's reward.

    Generates ``batch_size`` prompts at a time, left-padded (the attention mask keeps the padding out)."""
    import torch

    from verl_ext.reward import compute_score

    correct = 0
    model.eval()
    tokenizer = processor.tokenizer
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        with torch.no_grad():
            for start in range(0, len(examples), batch_size):
                chunk = examples[start : start + batch_size]
                batch = processor(
                    text=[_chat(processor, e["text"]) for e in chunk],
                    images=[e["image"] for e in chunk],
                    padding=True,
                    return_tensors="pt",
                )
                out = model.generate(**batch, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
                texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
                for example, text in zip(chunk, texts, strict=True):
                    correct += compute_score(DATA_SOURCE, text, example["answer"])["acc"] == 1.0
    finally:
        tokenizer.padding_side = side
        model.train()
    return correct / max(len(examples), 1)


def warm_start(
    model_dir: str,
    train_file: str,
    val_file: str,
    output_dir: str,
    *,
    target: float = 0.3,
    ceiling: float = 0.6,
    lr: float = 1e-3,
    batch_size: int = 8,
    eval_every: int = 5,
    max_steps: int = 400,
    seed: int = 0,
) -> dict:
    """Train ``model_dir`` into ``output_dir`` until the greedy validation accuracy reaches ``target``.

    Reuses ``output_dir`` when its :data:`STATE_FILE` records the same inputs. Raises :class:`WarmStartError` when
    ``max_steps`` pass below ``target`` or the first accuracy at or above it exceeds ``ceiling`` (lower ``lr`` or
    ``eval_every`` then). Returns the state: accuracy, steps, seconds.
    """
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    settings = {
        "model": os.path.abspath(model_dir),
        "train": os.path.abspath(train_file),
        "val": os.path.abspath(val_file),
        "target": target,
        "lr": lr,
        "batch_size": batch_size,
        "eval_every": eval_every,
        "seed": seed,
    }
    state_path = os.path.join(output_dir, STATE_FILE)
    if os.path.exists(state_path):
        with open(state_path) as f:
            state = json.load(f)
        if state.get("settings") == settings:
            return state
    started = time.perf_counter()
    torch.manual_seed(seed)
    rng = random.Random(seed)
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    train = examples_of(pd.read_parquet(train_file), with_variants=True)
    val = examples_of(pd.read_parquet(val_file), with_variants=False)
    encoded = []
    for example in train:
        batch, prompt_len = _inputs(processor, example, with_target=True)
        labels = batch["input_ids"].clone()
        labels[:, :prompt_len] = -100
        encoded.append((batch, labels))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    history = [(0, greedy_accuracy(model, processor, val))]
    order: list[int] = []
    step = 0
    while history[-1][1] < target:
        if step >= max_steps:
            raise WarmStartError(
                f"warm start: validation accuracy {history[-1][1]:.2f} after {step} steps, below the target "
                f"{target}; raise max_steps or lr (history {history})"
            )
        for _ in range(batch_size):
            if not order:
                order = list(range(len(encoded)))
                rng.shuffle(order)
            batch, labels = encoded[order.pop()]
            loss = model(**batch, labels=labels).loss / batch_size
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % eval_every == 0:
            history.append((step, greedy_accuracy(model, processor, val)))
            print(f"[warm start] step {step}: validation accuracy {history[-1][1]:.3f}", file=sys.stderr, flush=True)
    accuracy = history[-1][1]
    if accuracy > ceiling:
        raise WarmStartError(
            f"warm start: validation accuracy jumped to {accuracy:.2f} (> {ceiling}) at step {step}: the policy "
            f"would start solved; lower lr or eval_every (history {history})"
        )
    os.makedirs(output_dir, exist_ok=True)
    model.save_pretrained(output_dir)
    processor.save_pretrained(output_dir)
    processor.tokenizer.save_pretrained(output_dir)
    marker = os.path.join(model_dir, "tiny_model.json")
    if os.path.exists(marker):
        shutil.copy(marker, output_dir)
    state = {
        "settings": settings,
        "val_accuracy": accuracy,
        "steps": step,
        "history": history,
        "train_examples": len(train),
        "val_examples": len(val),
        "seconds": round(time.perf_counter() - started, 1),
    }
    with open(state_path, "w") as f:
        json.dump(state, f, indent=1)
    return state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the tiny model folder (verl_ext.cpu.tiny_model)")
    parser.add_argument("--train", required=True, help="swatch training parquet (diva-prep swatch)")
    parser.add_argument("--val", required=True, help="swatch validation parquet")
    parser.add_argument("--output", required=True, help="folder of the warm-started model")
    parser.add_argument("--target", type=float, default=0.3, help="stop at this greedy validation accuracy")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    state = warm_start(args.model, args.train, args.val, args.output, target=args.target, seed=args.seed)
    print(json.dumps({k: v for k, v in state.items() if k != "settings"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
