"""An exact torch stand-in for flash-attn's ``flash_attn_varlen_func``, on the CPU platform only.

With ``actor_rollout_ref.model.use_remove_padding=true`` (the GPU launchers' setting) verl packs a micro-batch's
sequences into one row and patches Qwen2-VL's and Qwen2.5-VL's attention (``verl.models.transformers.qwen2_vl``,
``qwen2_vl_attn_forward``): the sequences' boundaries are read from the position ids' text row (where they restart)
and the packed row goes through ``flash_attn_varlen_func``; a batch whose position ids never restart goes through
transformers' ``_flash_attention_forward``. flash-attn is a CUDA kernel: on a CPU verl's module does not even define
those names. :func:`varlen_attention` and :func:`flash_attention_forward` compute the same attention with torch, one
sequence at a time (its causal mask and sliding window, the kernel's conventions), so that the packed path that a
GPU run takes runs on the CPU too, through verl's own code (:func:`install`, applied by
:mod:`verl_ext.cpu.patches` only under ``VERL_PLATFORM=cpu``). Both refuse CUDA tensors: there flash-attn is the
kernel, and a stand-in must never replace it silently.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

NAME = "varlen_attention_on_cpu"


def _refuse_cuda(*tensors: torch.Tensor) -> None:
    if any(t.is_cuda for t in tensors):
        raise RuntimeError(
            f"{NAME}: the CPU stand-in for flash_attn_varlen_func was called with CUDA tensors. On a GPU verl calls "
            "flash-attn itself (pip install flash-attn); the stand-in is installed only with VERL_PLATFORM=cpu"
        )


def _allowed(q_len: int, k_len: int, causal: bool, window: tuple[int, int], device) -> torch.Tensor | None:
    """``(q_len, k_len)`` boolean mask, True where query i may attend to key j (flash-attn's conventions: causal
    and window aligned to the bottom-right corner; ``-1`` is an unbounded side); ``None`` when all may."""
    left, right = window
    if right < 0 and causal:
        right = 0
    elif causal:
        right = min(right, 0)
    if left < 0 and right < 0:
        return None
    i = torch.arange(q_len, device=device).unsqueeze(1) + (k_len - q_len)
    j = torch.arange(k_len, device=device).unsqueeze(0)
    allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    if right >= 0:
        allowed &= j <= i + right
    if left >= 0:
        allowed &= j >= i - left
    return allowed


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes=None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    **unused,
) -> torch.Tensor:
    """``flash_attn_varlen_func``'s contract: ``q (total_q, H, D)``, ``k, v (total_k, H_k, D)`` (``H_k`` divides
    ``H``), sequence ``b`` at rows ``cu_seqlens[b]:cu_seqlens[b + 1]``; returns ``(total_q, H, D)`` in ``q``'s dtype.
    Each sequence attends only to itself."""
    _refuse_cuda(q, k, v)
    if dropout_p:
        raise ValueError(f"{NAME}: attention dropout {dropout_p} is not supported (Qwen2-VL trains without it)")
    if softcap or alibi_slopes is not None or return_attn_probs:
        raise ValueError(f"{NAME}: softcap, ALiBi and returned probabilities are not supported (Qwen2-VL uses none)")
    heads, heads_k = q.shape[1], k.shape[1]
    if heads % heads_k:
        raise ValueError(f"{NAME}: {heads} query heads are not a multiple of {heads_k} key/value heads")
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out = torch.empty_like(q)
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    if len(bounds_q) != len(bounds_k):
        raise ValueError(f"{NAME}: {len(bounds_q) - 1} query sequences against {len(bounds_k) - 1} key sequences")
    spans_q, spans_k = (
        list(zip(bounds_q[:-1], bounds_q[1:], strict=True)),
        list(zip(bounds_k[:-1], bounds_k[1:], strict=True)),
    )
    for (q0, q1), (k0, k1) in zip(spans_q, spans_k, strict=True):
        if q1 == q0:
            continue
        query = q[q0:q1].transpose(0, 1)  # (H, Lq, D)
        key = k[k0:k1].transpose(0, 1).repeat_interleave(heads // heads_k, dim=0)
        value = v[k0:k1].transpose(0, 1).repeat_interleave(heads // heads_k, dim=0)
        mask = _allowed(q1 - q0, k1 - k0, causal, tuple(window_size), q.device)
        attended = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
        out[q0:q1] = attended.transpose(0, 1)
    return out


def flash_attention_forward(
    query_states: torch.Tensor,
    key_states: torch.Tensor,
    value_states: torch.Tensor,
    attention_mask: torch.Tensor | None,
    query_length: int,
    is_causal: bool = True,
    dropout: float = 0.0,
    position_ids: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    sliding_window: int | None = None,
    use_top_left_mask: bool = False,
    softcap: float | None = None,
    deterministic: bool | None = None,
    **unused,
) -> torch.Tensor:
    """transformers' ``_flash_attention_forward`` for ``(B, L, H, D)`` inputs: each row's tokens where
    ``attention_mask (B, L_k)`` is 1 (every token without a mask), through :func:`varlen_attention`; padded
    positions of the output are 0, as flash-attn's ``pad_input`` leaves them."""
    _refuse_cuda(query_states, key_states, value_states)
    if use_top_left_mask:
        raise ValueError(f"{NAME}: flash-attn < 2.1's top-left causal mask is not reproduced")
    batch, q_len = query_states.shape[:2]
    k_len = key_states.shape[1]
    if attention_mask is None:
        keep_q = torch.ones(batch, q_len, dtype=torch.bool, device=query_states.device)
        keep_k = torch.ones(batch, k_len, dtype=torch.bool, device=query_states.device)
    else:
        keep_k = attention_mask.bool()
        keep_q = keep_k[:, -q_len:]
    lengths_q, lengths_k = keep_q.sum(-1), keep_k.sum(-1)
    cu_q = F.pad(lengths_q.cumsum(0), (1, 0)).to(torch.int32)
    cu_k = F.pad(lengths_k.cumsum(0), (1, 0)).to(torch.int32)
    window = (sliding_window, sliding_window) if sliding_window is not None and k_len > sliding_window else (-1, -1)
    packed = varlen_attention(
        query_states[keep_q],
        key_states[keep_k],
        value_states[keep_k],
        cu_q,
        cu_k,
        dropout_p=dropout,
        softmax_scale=softmax_scale,
        causal=is_causal,
        window_size=window,
        softcap=softcap or 0.0,
    )
    out = query_states.new_zeros(query_states.shape)
    out[keep_q] = packed
    return out


def keep_input_dtype(query, key, value, target_dtype=None):
    """transformers' ``fa_peft_integration_check`` casts fp32 queries, keys and values to ``target_dtype`` (bf16 in
    verl's call) because flash-attn has no fp32 kernel; the stand-in has one, so an fp32 run stays fp32 (a bf16 run
    arrives in bf16 and is not cast either way)."""
    return query, key, value


def install() -> None:
    """Give verl's Qwen2-VL attention module (``verl.models.transformers.qwen2_vl``) the stand-ins for the flash-attn
    names it calls, and the capabilities it reads at call time (window size and determinism supported, bottom-right
    causal mask). Idempotent; the CPU platform only (:mod:`verl_ext.cpu.patches`)."""
    from verl.models.transformers import qwen2_vl

    qwen2_vl.flash_attn_varlen_func = varlen_attention
    qwen2_vl._flash_attention_forward = flash_attention_forward
    qwen2_vl.fa_peft_integration_check = keep_input_dtype
    qwen2_vl._flash_supports_window_size = True
    qwen2_vl._flash_supports_deterministic = True
    qwen2_vl._flash_use_top_left_mask = False
