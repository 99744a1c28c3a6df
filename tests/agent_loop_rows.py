"""One trajectory of the tiny Qwen2-VL as verl's agent loop stores it, for the tests that feed verl's forward directly.

Shared by ``tests/e2e/test_no_pixels_patch_on_cpu.py`` and ``tests/pgpo/blind_worker_run.py`` (a subprocess script,
which puts ``tests/`` on ``sys.path`` itself; under pytest ``tests/conftest.py``'s folder is on it already).
"""

from __future__ import annotations


def trajectory(processor, model, rng, with_image: bool, text: str, response: str) -> dict:
    """The processor-made prompt (one random 56x56 image first when ``with_image``), the response's tokens, verl's
    ``(4, L)`` position ids (the text index row, then the model's M-RoPE rows) and the pixels (``multi_modal_inputs``,
    empty for a text-only row)."""
    import numpy as np
    import torch
    from PIL import Image

    content = ([{"type": "image"}] if with_image else []) + [{"type": "text", "text": text}]
    chat = processor.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    images = [Image.fromarray(rng.integers(0, 255, (56, 56, 3), dtype=np.uint8))] if with_image else None
    encoded = processor(text=[chat], images=images, return_tensors="pt")
    prompt = encoded["input_ids"][0]
    answer = torch.tensor(processor.tokenizer.encode(response))
    ids = torch.cat([prompt, answer])
    multi_modal = {k: encoded[k] for k in ("pixel_values", "image_grid_thw") if k in encoded}
    if with_image:  # verl's agent loop: the text index row, then the model's rope index
        mm_types = (ids == model.config.image_token_id).int().unsqueeze(0)
        rope, _ = model.model.get_rope_index(
            ids.unsqueeze(0), mm_token_type_ids=mm_types, image_grid_thw=multi_modal["image_grid_thw"]
        )
        rope = rope[:, 0]
    else:
        rope = torch.arange(len(ids)).expand(3, -1)
    return {
        "prompts": prompt,
        "responses": answer,
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "position_ids": torch.cat([torch.arange(len(ids)).unsqueeze(0), rope]),
        "response_mask": torch.ones_like(answer),
        "loss_mask": torch.ones_like(answer),
        "multi_modal_inputs": multi_modal,
    }
