"""A supervised warm start of the tiny CPU model on the swatch task (:mod:`data_prep.swatch`): a base policy that
half-solves the task, for structural reasons rather than by stopping mid-way.

A random policy never writes ``\\boxed{}``: every reward is 0 and GRPO learns nothing. The paper starts from a base
model that half-solves its data; this pass makes the tiny model such a base, trained to convergence (a fixed number
of steps, the learning rate decayed linearly to 0, so that it ends at what its data teach and not at the noise of
its last batches):

* **format and perception**: the completion ``<think>colour</think>\\boxed{n}``, the colour always the true one,
  on its own rows (``SFT_ROWS``, its own seed, not the RL questions), all of them *clear* (hardness at most
  ``SFT_MAX_HARDNESS``): the RL runs' faint, small squares are new to it, as hard questions are to a base model;
* **hints**: the same rows asked with 2 or 3 of their hint steps (both name the colour and its place in the
  question's list) on a blank canvas, always taught the right number, so that the policy learns to follow a hint
  when the image tells nothing;
* **the number code, half known**: red's and green's numbers are always taught right; blue's and yellow's are drawn,
  afresh at every presentation, from :data:`~verl_ext.lab.sft_examples.UNKNOWN_CODE`: 0 (a number no colour stands for:
  the policy hedges) half of the time, the right one 20%, red's and green's 15% each. The warm policy thus answers blue
  and yellow wrongly when greedy, but samples the right number now and then: what RL must find from the reward. A wrong
  answer that is no colour's number keeps the two halves apart: RL pushing blue away from 0 pushes no colour away from
  its own number.

Its greedy validation accuracy is then at most the share of red and green questions it sees right, checked to be in
the issue's 20-60% band (:class:`WarmStartError` otherwise). Some seeds' tiny models read the faint squares later
than others (seed 37: 0.11 after 300 steps): below the band, the schedule runs again from where it stopped, up to
:data:`EXTRA_RUNS` times, so that a task builds at any seed; a seed inside the band after the first run stops there,
so every warm start recorded before is the same bytes.

Why a few lines of transformers and not verl's SFT trainer: verl 0.9.1's SFT trainer is a torchrun/FSDP job over
text-only chat parquet with no processor path for images in its multi-turn dataset, and no per-presentation label
draw. Here the model is loaded, fed and saved exactly as verl's workers load it (``AutoModelForImageTextToText`` on
the same folder, the same processor and chat template, so the same prompt tokens and image patches as the agent loop
builds), in about two minutes on 2 cores. Seeded from ``seed`` (rows, example order, label draws).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from collections.abc import Callable

import pandas as pd

from verl_ext.lab.sft_examples import (
    UNKNOWN_CODE,
    chat_text,
    sft_examples,
    taught_number,
    training_batch,
    validation_examples,
    with_prompt_tokens,
)

STATE_FILE = "warm_start.json"
DATA_SOURCE = "diva_swatch"
MAX_NEW_TOKENS = 32
SFT_ROWS = 256
SFT_MAX_HARDNESS = 0.5


class WarmStartError(RuntimeError):
    """The warm start could not bring the tiny model into its target accuracy band (the message says why)."""


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
                    text=[chat_text(processor, e["text"]) for e in chunk],
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


# At most this many more runs of the schedule (``steps`` each, the learning rate again decayed linearly from ``lr`` to
# 0) when the greedy accuracy is still below the band after the first: some seeds' tiny models read the faint
# squares later than others (seed 37: 0.11 after 300 steps). A seed inside the band after the first run stops there,
# so the warm starts already recorded are the same bytes.
EXTRA_RUNS = 3


def _settings(model_dir, val_file, steps, lr, batch_size, seed, code) -> dict:
    """What a warm start is a function of (its reuse key)."""
    settings = {
        "model": os.path.abspath(model_dir),
        "val": os.path.abspath(val_file),
        "sft_rows": SFT_ROWS,
        "sft_max_hardness": SFT_MAX_HARDNESS,
        "unknown_code": UNKNOWN_CODE,
        "steps": steps,
        "lr": lr,
        "batch_size": batch_size,
        "seed": seed,
    }
    if code is not None:  # the swatch task's settings stay as its recorded warm starts wrote them
        settings["code"] = code
    return settings


def _reusable_state(state_path: str, settings: dict, band: tuple[float, float]) -> dict | None:
    """The state in ``state_path`` when it records the same ``settings`` and an accuracy inside ``band``."""
    if not os.path.exists(state_path):
        return None
    with open(state_path) as f:
        state = json.load(f)
    if state.get("settings") == json.loads(json.dumps(settings)) and band[0] <= state["val_accuracy"] <= band[1]:
        return state
    return None


def _supervised_run(model, processor, train: list[dict], sft_state: dict, steps: int, done: int) -> list:
    """``steps`` supervised steps of ``model`` on ``train`` (the learning rate decayed linearly from its
    ``sft_state["lr"]`` to 0), continuing the optimiser, example order and label draws of ``sft_state``; returns
    ``(step, loss)`` every 50 steps, the steps counted from ``done``, the steps of the runs before."""
    import torch

    if "optimizer" not in sft_state:
        sft_state["optimizer"] = torch.optim.AdamW(model.parameters(), lr=sft_state["lr"], weight_decay=0.0)
    optimizer = sft_state["optimizer"]
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / steps)
    rng, order, code, losses = sft_state["rng"], sft_state["order"], sft_state["code"], []
    for step in range(1, steps + 1):
        chosen = []
        for _ in range(sft_state["batch_size"]):
            if not order:
                order.extend(range(len(train)))
                rng.shuffle(order)
            chosen.append(train[order.pop()])
        numbers = [taught_number(e["colour"], e["answer"], rng, e.get("hinted", False), code) for e in chosen]
        batch, labels = training_batch(processor, chosen, numbers)
        loss = model(**batch, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == steps:
            losses.append((done + step, round(loss.item(), 4)))
            print(f"[warm start] step {done + step}: loss {loss.item():.4f}", file=sys.stderr, flush=True)
    return losses


def _train_into_band(
    train_run: Callable[[int], list], accuracy: Callable[[], float], band: tuple[float, float], steps: int
) -> tuple[list, list[float]]:
    """``train_run(done)`` (one run of the schedule, ``done`` steps before it) then ``accuracy()``, again while the
    accuracy is below ``band``, at most 1 + :data:`EXTRA_RUNS` times; returns the losses and each run's accuracy.
    Raises :class:`WarmStartError` when the last accuracy is outside ``band``."""
    losses, accuracies = [], []
    for run in range(1 + EXTRA_RUNS):
        losses += train_run(run * steps)
        accuracies.append(accuracy())
        print(f"[warm start] greedy validation accuracy {accuracies[-1]:.3f}", file=sys.stderr, flush=True)
        if accuracies[-1] >= band[0]:  # inside the band, or above it, which more training would not bring down
            break
    if not band[0] <= accuracies[-1] <= band[1]:
        raise WarmStartError(
            f"warm start: greedy validation accuracy {accuracies[-1]:.2f} after {len(accuracies) * steps} steps "
            f"({len(accuracies)} run(s) of {steps}, accuracies {accuracies}) is outside {band}: the policy would "
            f"start {'solved' if accuracies[-1] > band[1] else 'unable to answer'} (losses {losses})"
        )
    return losses, accuracies


def _save(model, processor, model_dir: str, output_dir: str) -> None:
    os.makedirs(output_dir, exist_ok=True)
    model.save_pretrained(output_dir)
    processor.save_pretrained(output_dir)
    processor.tokenizer.save_pretrained(output_dir)
    marker = os.path.join(model_dir, "tiny_model.json")
    if os.path.exists(marker):
        shutil.copy(marker, output_dir)


def warm_start(
    model_dir: str,
    val_file: str,
    output_dir: str,
    *,
    steps: int = 300,
    lr: float = 2e-3,
    batch_size: int = 16,
    band: tuple[float, float] = (0.2, 0.6),
    seed: int = 0,
    code: dict | None = None,
) -> dict:
    """Train ``model_dir`` into ``output_dir`` (module docstring) and check its greedy accuracy on ``val_file``.

    ``code``: the numbers taught per colour, plain and hinted (:func:`~verl_ext.lab.sft_examples.taught_number`;
    default: the swatch task's). Below ``band`` after ``steps``, the schedule runs again, up to :data:`EXTRA_RUNS`
    times. Reuses ``output_dir`` when its :data:`STATE_FILE` records the same inputs. Raises :class:`WarmStartError`
    when the accuracy is above ``band``, or still below it after every run. Returns the state: accuracy, steps, seconds,
    the loss every 50 steps.
    """
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from data_prep.swatch import swatch_rows

    settings = _settings(model_dir, val_file, steps, lr, batch_size, seed, code)
    state_path = os.path.join(output_dir, STATE_FILE)
    reused = _reusable_state(state_path, settings, band)
    if reused is not None:
        return reused
    started = time.perf_counter()
    torch.manual_seed(seed)
    sft_state = {"rng": random.Random(seed), "order": [], "lr": lr, "batch_size": batch_size, "code": code}
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    rows = swatch_rows(SFT_ROWS, seed=10_000 + seed, split="sft", max_hardness=SFT_MAX_HARDNESS)
    train = with_prompt_tokens(processor, sft_examples(rows))
    val = validation_examples(pd.read_parquet(val_file))
    losses, accuracies = _train_into_band(
        lambda done: _supervised_run(model, processor, train, sft_state, steps, done),
        lambda: greedy_accuracy(model, processor, val),
        band,
        steps,
    )
    _save(model, processor, model_dir, output_dir)
    state = {
        "settings": settings,
        "val_accuracy": accuracies[-1],
        "steps": len(accuracies) * steps,
        "losses": losses,
        "train_examples": len(train),
        "val_examples": len(val),
        "seconds": round(time.perf_counter() - started, 1),
    }
    if len(accuracies) > 1:  # the seeds inside the band after one run keep the state they recorded
        state["accuracy_per_run"] = accuracies
    with open(state_path, "w") as f:
        json.dump(state, f, indent=1)
    return state


def prepare_warm_started(
    workdir: str,
    seed: int,
    *,
    model_folder: str,
    data_name: str,
    train_questions: int,
    val_questions: int,
    code: dict | None = None,
) -> dict:
    """A task's files under ``workdir`` (each reused when present): the tiny Qwen2-VL, ``val_questions`` validation
    and ``train_questions`` training swatch questions (``<data_name>_{val,train}_seed<seed>.parquet``), and the
    model warm-started on the validation set's colours with ``code`` (:func:`warm_start`) into ``model_folder``.
    The training file carries ``extra_info.visual_entropy`` from the warm start's vision tower (``diva-prep
    entropy``, as a user computes it: Durian reads it, the other methods ignore it, so every method trains on one
    file). Returns the paths (``model`` is the warm start) and ``warm_start`` (its state)."""
    from pathlib import Path

    from data_prep.entropy import EntropyOptions, run_entropy
    from data_prep.swatch import swatch
    from verl_ext.cpu.tiny_model import build_tiny_qwen2_vl

    os.makedirs(workdir, exist_ok=True)
    base = os.path.join(workdir, "tiny_qwen2_vl")
    paths = {
        "model": os.path.join(workdir, model_folder),
        "train": os.path.join(workdir, f"{data_name}_train_seed{seed}.parquet"),
        "val": os.path.join(workdir, f"{data_name}_val_seed{seed}.parquet"),
    }
    build_tiny_qwen2_vl(base, seed=seed)
    if not os.path.exists(paths["val"]):
        swatch(paths["val"], val_questions, seed=2 * seed + 1, split="test")
    state = warm_start(base, paths["val"], paths["model"], seed=seed, code=code)
    if not os.path.exists(paths["train"]):
        raw = os.path.join(workdir, f"{data_name}_train_seed{seed}_raw.parquet")
        swatch(raw, train_questions, seed=2 * seed, split="train")
        run_entropy(raw, paths["train"], EntropyOptions(model=Path(paths["model"]), device="cpu", progress=False))
    return {**paths, "warm_start": {k: v for k, v in state.items() if k != "settings"}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the tiny model folder (verl_ext.cpu.tiny_model)")
    parser.add_argument("--val", required=True, help="swatch validation parquet")
    parser.add_argument("--output", required=True, help="folder of the warm-started model")
    parser.add_argument("--steps", type=int, default=300, help="supervised steps (batches of 16)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    state = warm_start(args.model, args.val, args.output, steps=args.steps, seed=args.seed)
    print(json.dumps({k: v for k, v in state.items() if k != "settings"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
