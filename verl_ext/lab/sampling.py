"""Sampling from a policy and scoring its answers, as the sparse task's measurements do: the prompts of a swatch
frame (:func:`prompts`, original or hinted), sampled answers and their rewards (:func:`sample_answers`,
:func:`sampled_accuracy`), and the log-probability of the right completion, whole and in parts
(:func:`right_log_prob_parts`). The model is loaded, fed and prompted as verl's workers are
(:mod:`verl_ext.lab.warm_start`).
"""

from __future__ import annotations


def prompts(frame, hint_steps: int) -> list[dict]:
    """The rows of ``frame`` asked with their first ``hint_steps`` hint steps (0: the original question):
    ``{"text", "image", "answer"}``."""
    from verl_ext.data.schema import build_prompt_text
    from verl_ext.lab.sft_examples import row_image

    out = []
    for _, row in frame.iterrows():
        steps = list(row["hint_steps"])[:hint_steps] if hint_steps else None
        answer = row["reward_model"]["ground_truth"]
        out.append(
            {"text": build_prompt_text(row["question"], 1, hint_steps=steps), "image": row_image(row), "answer": answer}
        )
    return out


def inputs(processor, prompts: list[dict]):
    """The processor's left-padded batch of ``prompts`` (generation appends on the right)."""
    from verl_ext.lab.sft_examples import chat_text

    tokenizer = processor.tokenizer
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        return processor(
            text=[chat_text(processor, p["text"]) for p in prompts],
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

    from verl_ext.lab.warm_start import DATA_SOURCE, MAX_NEW_TOKENS
    from verl_ext.reward import compute_score

    repeated = [p for p in prompts for _ in range(samples)]
    batch = inputs(processor, repeated)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            **batch, max_new_tokens=MAX_NEW_TOKENS, do_sample=True, temperature=temperature, top_p=1.0, top_k=0
        )
    responses = out[:, batch["input_ids"].shape[1] :]
    texts = processor.tokenizer.batch_decode(responses, skip_special_tokens=True)
    rewards = [compute_score(DATA_SOURCE, t, p["answer"])["acc"] for t, p in zip(texts, repeated, strict=True)]
    return batch, responses, rewards


def response_log_probs(model, batch, responses, pad_id: int, eos_id: int):
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
    batch = inputs(processor, prompts)
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
        total, _, token_logp = response_log_probs(
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


def sampled_accuracy(model, processor, prompts: list[dict], samples: int, seed: int) -> float:
    """The share of right answers among ``samples`` per prompt at the rollouts' temperature."""
    from verl_ext.lab.rl_settings import ROLLOUT_TEMPERATURE

    _, _, rewards = sample_answers(model, processor, prompts, samples, ROLLOUT_TEMPERATURE, seed)
    return sum(rewards) / len(rewards)
