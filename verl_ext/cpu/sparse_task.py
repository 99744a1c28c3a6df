"""The sparse task: DIVA-GRPO's regime on the CPU (``TASK=sparse bash run_scripts/compare_tiny.sh``).

DIVA-GRPO is for questions so hard that every response of a GRPO group is wrong (zero advantage, no signal), whose
easier variants (hints) are solvable, so that the question's global group has a signal that can carry back to the
original. This task is built for that regime from the swatch task's data (:mod:`data_prep.swatch`: the same images,
questions and hint steps) and a warm start that knows less (:data:`SPARSE_CODE`):

* red and green squares: the number taught right, plain and hinted (the easy half);
* blue and yellow squares (the hard half, :data:`HARD_COLOURS`): asked plainly, the policy reads the colour and writes
  it in its ``<think>`` (perception is taught right for every colour) but was taught 0, a number no colour stands
  for, :data:`PLAIN_RIGHT` of the time the right one; at the rollouts' temperature its groups of 8 are all wrong;
* hinted (the hint steps name the colour and its place in the question's list: "the square is blue, the third
  colour"), the right number :data:`HINTED_RIGHT` of the time: a hint is solvable, its group disagrees;
* what a hint teaches is what the original needs: a right hinted response is ``<think>blue</think>\\boxed{3}``, the
  same completion the original needs after the same ``<think>``; the number after the colour is what both learn.

:func:`task_properties` measures the three properties from the warm start (sampling as the rollouts do, temperature
:data:`verl_ext.cpu.rl_settings.ROLLOUT_TEMPERATURE`) and :func:`check_properties` refuses the task when one fails:

1. **unsolved**: the share of training questions none of whose :data:`PROPERTY_SAMPLES` sampled original answers is
   right, and the chance that a GRPO group of 8 on them is all wrong;
2. **hints solvable**: the accuracy of those questions' hinted prompts (the hint DIVA-GRPO's planner gives a question
   every response of which failed: 2 of the 3 steps) is at least :data:`MIN_HINT_ACCURACY`;
3. **hints transfer**: :data:`TRANSFER_STEPS` steps of a plain on-policy GRPO update (group-normalised advantage,
   the runs' learning rate and optimiser) on the hinted prompts alone raise the right answer's probability on the
   unhinted originals, which the update never sees: the mean log-probability of the right completion at least
   doubles the probability (rises by ``log 2``); the sampled accuracy is reported beside it. The updates go on to
   :data:`TRANSFER_HORIZON` steps, measured every :data:`TRANSFER_STEPS` (``trajectory``): how far the transfer goes
   once the hints are learned.

Why a plain loop and not verl for property 3: it is a measurement of the warm start (one question: does a gradient
step on the hinted prompt move the original?), made in a few seconds with the model loaded as verl's workers load
it; the runs themselves train through verl.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

HARD_COLOURS = ("blue", "yellow")
PLAIN_RIGHT = 0.03
HINTED_RIGHT = 0.6
# Per colour: the numbers the warm start teaches, plain and hinted (verl_ext.cpu.warm_start.taught_number; absent:
# the right number). Hard colours' wrong answer is 0, no colour's number, as in the swatch task.
SPARSE_CODE = {
    "blue": {
        "plain": (("0", 1 - PLAIN_RIGHT), ("3", PLAIN_RIGHT)),
        "hinted": (("3", HINTED_RIGHT), ("0", 1 - HINTED_RIGHT)),
    },
    "yellow": {
        "plain": (("0", 1 - PLAIN_RIGHT), ("4", PLAIN_RIGHT)),
        "hinted": (("4", HINTED_RIGHT), ("0", 1 - HINTED_RIGHT)),
    },
}
TRAIN_QUESTIONS = 8
VAL_QUESTIONS = 64
HINT_STEPS = 2  # the planner's hint for a question at D = 7 (every response wrong once from d_init 5): ceil(0.5 * 3)
PROPERTY_SAMPLES = 32
GROUP = 8  # GRPO's responses per question in the comparison (2 n, n = 4)
MIN_UNSOLVED_SHARE = 0.25
MIN_HINT_ACCURACY = 0.2
TRANSFER_STEPS = 6
TRANSFER_HORIZON = 24  # the updates go on, measured every TRANSFER_STEPS: where the transfer stops (the hints learned)
PROPERTIES_FILE = "sparse_properties.json"
# Validation questions are "solved" when one of QUESTION_SAMPLES sampled answers (the rollouts' temperature, the same
# seed at the start and the end) is right: the warm start's unsolved ones and, per run, those its final policy solves.
QUESTION_SAMPLES = 16
QUESTIONS_FILE = "questions.json"


def prepare_sparse(workdir: str, seed: int = 0) -> dict:
    """The sparse task under ``workdir`` (reused when present): the tiny Qwen2-VL warm-started with
    :data:`SPARSE_CODE`, training and validation questions, and the three properties measured and checked
    (``properties``). Returns the paths (``model`` is the warm start), ``warm_start`` and ``properties``."""
    from verl_ext.cpu.warm_start import prepare_warm_started

    paths = prepare_warm_started(
        workdir,
        seed,
        model_folder=f"sparse_warm_start_seed{seed}",
        data_name="sparse",
        train_questions=TRAIN_QUESTIONS,
        val_questions=VAL_QUESTIONS,
        code=SPARSE_CODE,
    )
    properties = cached_properties(paths["model"], paths["train"], paths["val"], seed=seed)
    return {**paths, "properties": properties}


def cached_properties(model_dir: str, train_file: str, val_file: str, seed: int = 0) -> dict:
    """:func:`task_properties` of the warm start in ``model_dir``, kept in its :data:`PROPERTIES_FILE` (measured
    once per warm start), then :func:`check_properties`."""
    path = Path(model_dir) / PROPERTIES_FILE
    if path.exists():
        properties = json.loads(path.read_text())
    else:
        properties = task_properties(model_dir, train_file, val_file, seed=seed)
        path.write_text(json.dumps(properties, indent=1))
    check_properties(properties)
    return properties


class SparseTaskError(RuntimeError):
    """The warm start does not put the sparse task in DIVA-GRPO's regime (the message names the property)."""


def check_properties(properties: dict) -> None:
    """Raise :class:`SparseTaskError` naming each of the three properties that does not hold."""
    failed = [name for name in ("unsolved", "hints_solvable", "hints_transfer") if not properties[name]["held"]]
    if failed:
        raise SparseTaskError(
            f"the sparse task's warm start fails {failed}: {json.dumps({k: properties[k] for k in failed})}"
        )


def property_lines(properties: dict) -> list[str]:
    """The three properties as a newcomer reads them (printed before training)."""
    unsolved, hints, transfer = properties["unsolved"], properties["hints_solvable"], properties["hints_transfer"]
    mark = lambda held: "holds" if held else "FAILS"  # noqa: E731
    return [
        f"[sparse] 1. unsolved ({mark(unsolved['held'])}): {unsolved['count']} of {unsolved['questions']} training "
        f"questions ({unsolved['share']:.0%}) have no right answer in {unsolved['samples']} samples at temperature "
        f"{unsolved['temperature']}; a GRPO group of {GROUP} on them is all wrong with probability "
        f"about {unsolved['all_wrong_at_group']:.2f} (validation: {properties['validation_unsolved_share']:.0%} "
        f"unsolved in {QUESTION_SAMPLES} samples)",
        f"[sparse] 2. hints solvable ({mark(hints['held'])}): their {hints['hint_steps']}-step hints are right "
        f"{hints['accuracy']:.0%} of the time (at least {MIN_HINT_ACCURACY:.0%} needed), the originals "
        f"{unsolved['right']} of {unsolved['count'] * unsolved['samples']}",
        f"[sparse] 3. hints transfer ({mark(transfer['held'])}): {transfer['steps']} GRPO steps on the hinted prompts "
        f"alone move the unhinted originals' right answer from log-probability {transfer['log_prob_before']:.2f} to "
        f"{transfer['log_prob_after']:.2f} (sampled accuracy {transfer['accuracy_before']:.1%} -> "
        f"{transfer['accuracy_after']:.1%}; the hints {hints['accuracy']:.0%} -> "
        f"{transfer['hint_accuracy_after']:.0%})" + _horizon_text(transfer),
    ]


def _horizon_text(transfer: dict) -> str:
    """Where the transfer stands at the end of its trajectory, when it went on past the check's steps."""
    trajectory = transfer.get("trajectory") or []
    if len(trajectory) < 3:
        return ""
    end = trajectory[-1]
    return (
        f"; after {end['step']} steps {end['log_prob']:.2f} (accuracy {end['accuracy']:.1%}, the hints "
        f"{end['hint_accuracy']:.0%})"
    )


# --- measuring ---------------------------------------------------------------------------------------------------


def _prompts(frame, hint_steps: int) -> list[dict]:
    from verl_ext.cpu.warm_start import _image
    from verl_ext.data.schema import build_prompt_text

    out = []
    for _, row in frame.iterrows():
        steps = list(row["hint_steps"])[:hint_steps] if hint_steps else None
        answer = row["reward_model"]["ground_truth"]
        out.append(
            {"text": build_prompt_text(row["question"], 1, hint_steps=steps), "image": _image(row), "answer": answer}
        )
    return out


def _inputs(processor, prompts: list[dict]):
    from verl_ext.cpu.warm_start import _chat

    tokenizer = processor.tokenizer
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        return processor(
            text=[_chat(processor, p["text"]) for p in prompts],
            images=[p["image"] for p in prompts],
            padding=True,
            return_tensors="pt",
        )
    finally:
        tokenizer.padding_side = side


def sample_answers(model, processor, prompts: list[dict], samples: int, temperature: float, seed: int):
    """``samples`` sampled completions per prompt (prompts repeated, so every row has its own image): returns the
    batch (inputs and generated ids) and the reward of each completion, prompt-major."""
    import torch

    from verl_ext.cpu.warm_start import DATA_SOURCE, MAX_NEW_TOKENS
    from verl_ext.reward import compute_score

    repeated = [p for p in prompts for _ in range(samples)]
    batch = _inputs(processor, repeated)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            **batch, max_new_tokens=MAX_NEW_TOKENS, do_sample=True, temperature=temperature, top_p=1.0, top_k=0
        )
    responses = out[:, batch["input_ids"].shape[1] :]
    texts = processor.tokenizer.batch_decode(responses, skip_special_tokens=True)
    rewards = [compute_score(DATA_SOURCE, t, p["answer"])["acc"] for t, p in zip(texts, repeated, strict=True)]
    return batch, responses, rewards


def _response_log_probs(model, batch, responses, pad_id: int, eos_id: int):
    """Per-sequence sum of the log-probabilities of ``responses`` (tokens up to and with the first end token), the
    response mask, and each token's log-probability (0 outside the mask)."""
    import torch

    ids = torch.cat([batch["input_ids"], responses], dim=1)
    after_eos = torch.cumsum((responses == eos_id).long(), dim=1) - (responses == eos_id).long()
    response_mask = (after_eos == 0) & (responses != pad_id) | (responses == eos_id) & (after_eos == 0)
    mask = torch.cat([batch["attention_mask"], response_mask.long()], dim=1)
    extra = {k: v for k, v in batch.items() if k not in ("input_ids", "attention_mask")}
    if "mm_token_type_ids" in extra:  # the response's tokens are text (type 0)
        extra["mm_token_type_ids"] = torch.cat(
            [extra["mm_token_type_ids"], torch.zeros_like(responses, dtype=extra["mm_token_type_ids"].dtype)], dim=1
        )
    logits = model(input_ids=ids, attention_mask=mask, **extra).logits
    prompt_len = batch["input_ids"].shape[1]
    logp = torch.log_softmax(logits[:, prompt_len - 1 : -1].float(), dim=-1)
    token_logp = logp.gather(-1, responses.unsqueeze(-1)).squeeze(-1) * response_mask
    return token_logp.sum(dim=1), response_mask, token_logp


def right_log_prob(model, processor, prompts: list[dict]) -> float:
    """Mean over ``prompts`` of the log-probability (temperature 1) of the right completion
    (:func:`data_prep.swatch.answer_text` of the prompt's colour)."""
    return right_log_prob_parts(model, processor, prompts)["total"]


def right_log_prob_parts(model, processor, prompts: list[dict]) -> dict:
    """:func:`right_log_prob` and its two parts, means over ``prompts``: ``colour``, the tokens of the colour word in
    ``<think>`` (perception), and ``number``, the tokens of the boxed number (what the hint teaches). The rest (the
    format, the end token) is ``total - colour - number``. A run can move the two apart: a response's advantage falls
    on all its tokens, so an all-wrong group's negative advantage pushes down the right colour word with the wrong
    number."""
    import torch

    from data_prep.swatch import PALETTE, answer_text

    colour = {number: name for name, _, number in PALETTE}
    batch = _inputs(processor, prompts)
    tokenizer = processor.tokenizer
    texts = [answer_text(colour[p["answer"]]) for p in prompts]
    encoded = tokenizer(
        [t + tokenizer.eos_token for t in texts],
        add_special_tokens=False,
        padding=True,
        return_tensors="pt",
        return_offsets_mapping=True,
    )
    responses = encoded["input_ids"].masked_fill(encoded["attention_mask"] == 0, tokenizer.pad_token_id)
    with torch.no_grad():
        total, _, token_logp = _response_log_probs(
            model, batch, responses, tokenizer.pad_token_id, tokenizer.eos_token_id
        )
    parts = {"colour": [], "number": []}
    for i, (text, prompt) in enumerate(zip(texts, prompts, strict=True)):
        word_start = text.index("<think>") + len("<think>")
        spans = {
            "colour": (word_start, word_start + len(colour[prompt["answer"]])),
            "number": (text.index("{") + 1, text.index("}")),
        }
        for part, (start, end) in spans.items():
            inside = [
                j
                for j, (a, b) in enumerate(encoded["offset_mapping"][i].tolist())
                if encoded["attention_mask"][i, j] and b > a and a >= start and b <= end
            ]
            parts[part].append(float(token_logp[i, inside].sum()))
    return {
        "total": float(total.mean()),
        "colour": sum(parts["colour"]) / len(prompts),
        "number": sum(parts["number"]) / len(prompts),
    }


def task_properties(
    model_dir: str,
    train_file: str,
    val_file: str,
    *,
    seed: int = 0,
    samples: int = PROPERTY_SAMPLES,
    steps: int = TRANSFER_STEPS,
    horizon: int = TRANSFER_HORIZON,
) -> dict:
    """The three properties of the module docstring, measured on the warm start in ``model_dir`` (the transfer
    followed to ``horizon`` steps)."""
    import pandas as pd
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from verl_ext.cpu.rl_settings import RL_LR, ROLLOUT_TEMPERATURE

    torch.manual_seed(seed)
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    train = pd.read_parquet(train_file)
    originals = _prompts(train, 0)
    _, _, rewards = sample_answers(model, processor, originals, samples, ROLLOUT_TEMPERATURE, seed)
    per_question = [sum(rewards[i * samples : (i + 1) * samples]) / samples for i in range(len(originals))]
    unsolved = [i for i, acc in enumerate(per_question) if acc == 0.0]
    val_per_question = question_accuracy(model, processor, val_file, seed=seed)
    # A question never right in `samples` draws: its accuracy is below ~3/samples (95%); the chance that a group of
    # GROUP is all wrong is estimated from the pooled accuracy of those questions (+1 smoothing: never 1 exactly).
    hard_rows = train.iloc[unsolved] if unsolved else train.iloc[:0]
    pooled = (sum(per_question[i] * samples for i in unsolved) + 1) / (len(unsolved) * samples + 2) if unsolved else 1
    hinted = _prompts(hard_rows, HINT_STEPS)
    hint_accuracy = _accuracy(model, processor, hinted, samples, seed + 2) if hinted else 0.0
    hard_originals = [originals[i] for i in unsolved]
    transfer = (
        _transfer(model, processor, hinted, hard_originals, steps, seed, RL_LR, ROLLOUT_TEMPERATURE, horizon)
        if unsolved
        else {"held": False, "why": "no unsolved question"}
    )
    return {
        "temperature": ROLLOUT_TEMPERATURE,
        "per_question_accuracy": per_question,
        "unsolved": {
            "held": len(unsolved) / len(originals) >= MIN_UNSOLVED_SHARE,
            "count": len(unsolved),
            "questions": len(originals),
            "share": len(unsolved) / len(originals),
            "indices": unsolved,
            "samples": samples,
            "temperature": ROLLOUT_TEMPERATURE,
            "right": round(sum(per_question[i] * samples for i in unsolved)),
            "accuracy": pooled,
            "all_wrong_at_group": (1 - pooled) ** GROUP,
        },
        "validation_accuracy": val_per_question,
        "validation_unsolved_share": sum(c == 0 for c in val_per_question) / len(val_per_question),
        "validation_unsolved": [i for i, c in enumerate(val_per_question) if c == 0],
        "hints_solvable": {
            "held": hint_accuracy >= MIN_HINT_ACCURACY,
            "hint_steps": HINT_STEPS,
            "accuracy": hint_accuracy,
        },
        "hints_transfer": transfer,
    }


def question_accuracy(model, processor, val_file: str, seed: int = 0) -> list[float]:
    """Per validation question (the originals), the fraction of :data:`QUESTION_SAMPLES` sampled answers that are
    right (seeded from ``seed``: the same draws for every policy measured)."""
    import pandas as pd

    from verl_ext.cpu.rl_settings import ROLLOUT_TEMPERATURE

    prompts = _prompts(pd.read_parquet(val_file), 0)
    n = QUESTION_SAMPLES
    _, _, rewards = sample_answers(model, processor, prompts, n, ROLLOUT_TEMPERATURE, seed + 1)
    return [sum(rewards[i * n : (i + 1) * n]) / n for i in range(len(prompts))]


def final_weights(run_dir: str | Path) -> Path:
    """The Hugging Face folder of a run's last checkpoint (``checkpoints/global_step_N/actor/huggingface``)."""
    found = sorted(
        Path(run_dir).glob("checkpoints/global_step_*/actor/huggingface/model.safetensors"),
        key=lambda p: int(p.parts[-4].rsplit("_", 1)[1]),
    )
    if not found:
        raise FileNotFoundError(
            f"{run_dir}: no checkpoints/global_step_*/actor/huggingface/model.safetensors (the sparse task's runs "
            "save hf_model: verl_ext.cpu.compare.task_overrides)"
        )
    return found[-1].parent


def solved_record(run_dir: str | Path, warm_start: str, val_file: str, properties: dict, seed: int = 0) -> dict:
    """Which of the warm start's unsolved validation questions (``properties``, :func:`task_properties`) the run's
    final policy solves, written to the run's :data:`QUESTIONS_FILE`: ``{"step", "accuracy": per question,
    "initially_unsolved", "solved", "solved_share", "unsolved_right_log_prob": {"start", "end"},
    "unsolved_right_log_prob_parts": {"start", "end"}}``, the last two the mean log-probability of the right completion
    on those questions at the warm start and at the end, whole and in parts (:func:`right_log_prob_parts`): how far
    the run moved the questions it could not yet solve, and which part it moved, which accuracy at 16 samples cannot
    see below about 1/16. ``val_file``: the task's validation questions (not a views file)."""
    import pandas as pd
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    weights = final_weights(run_dir)
    processor = AutoProcessor.from_pretrained(warm_start)  # the run's own processor: the warm start's
    unsolved = list(properties["validation_unsolved"])
    hard = [p for i, p in enumerate(_prompts(pd.read_parquet(val_file), 0)) if i in set(unsolved)]
    parts = {}
    for when, folder in (("start", warm_start), ("end", weights)):
        model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
        parts[when] = right_log_prob_parts(model, processor, hard) if hard else None
    accuracy = question_accuracy(model, processor, val_file, seed=seed)  # the final policy's
    solved = [i for i in unsolved if accuracy[i] > 0]
    record = {
        "step": int(weights.parts[-3].rsplit("_", 1)[1]),
        "accuracy": accuracy,
        "initially_unsolved": unsolved,
        "solved": solved,
        "solved_share": len(solved) / len(unsolved) if unsolved else None,
        "unsolved_right_log_prob": {when: p["total"] if p else None for when, p in parts.items()},
        "unsolved_right_log_prob_parts": parts,
    }
    (Path(run_dir) / QUESTIONS_FILE).write_text(json.dumps(record))
    return record


def _accuracy(model, processor, prompts: list[dict], samples: int, seed: int) -> float:
    from verl_ext.cpu.rl_settings import ROLLOUT_TEMPERATURE

    _, _, rewards = sample_answers(model, processor, prompts, samples, ROLLOUT_TEMPERATURE, seed)
    return sum(rewards) / len(rewards)


def _transfer(
    model, processor, hinted, originals, steps: int, seed: int, lr: float, temperature: float, horizon: int = 0
) -> dict:
    """``steps`` on-policy GRPO updates on ``hinted`` alone (:data:`GROUP` responses each, advantage
    ``(r - mean) / (std + 1e-6)`` per group, token-mean loss, AdamW at ``lr``); the originals' right-answer
    log-probability and sampled accuracy before and after. The updates go on to ``horizon`` steps (when larger),
    measured every ``steps`` (``trajectory``): how far the transfer goes once the hints are learned."""
    import torch

    tokenizer = processor.tokenizer

    def measure(step: int) -> dict:
        return {
            "step": step,
            "log_prob": right_log_prob(model, processor, originals),
            "accuracy": _accuracy(model, processor, originals, PROPERTY_SAMPLES, seed + 3),
            "hint_accuracy": _accuracy(model, processor, hinted, PROPERTY_SAMPLES, seed + 2),
        }

    trajectory = [measure(0)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for step in range(max(steps, horizon)):
        batch, responses, rewards = sample_answers(model, processor, hinted, GROUP, temperature, seed + 100 + step)
        r = torch.tensor(rewards).view(len(hinted), GROUP)
        advantage = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).flatten()
        model.train()
        total, mask, _ = _response_log_probs(model, batch, responses, tokenizer.pad_token_id, tokenizer.eos_token_id)
        # sum over a response's tokens of A * log p, averaged over all response tokens (verl's token-mean)
        loss = -(advantage * total).sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        model.eval()
        if (step + 1) % steps == 0:
            trajectory.append(measure(step + 1))
    start, at = trajectory[0], trajectory[1]
    return {
        "held": at["log_prob"] > start["log_prob"] + math.log(2),
        "steps": steps,
        "lr": lr,
        "log_prob_before": start["log_prob"],
        "log_prob_after": at["log_prob"],
        "accuracy_before": start["accuracy"],
        "accuracy_after": at["accuracy"],
        "hint_accuracy_after": at["hint_accuracy"],
        "trajectory": trajectory,
    }
