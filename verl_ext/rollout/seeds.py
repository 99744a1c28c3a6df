"""Seeds from a run's seed and a draw's place in the run, never from process state.

verl seeds its rollout once per server (vLLM's engine seed, ``rollout.seed + replica_rank``) and names prompts with
``uuid4``: which response gets which random numbers then depends on request arrival order, and no two runs (or a
run and its resume) sample alike. Here every draw gets its own seed, a hash of where it sits in the run:

* :func:`prompt_uid`: a training prompt's uid from (seed, step, fetch, row), a UUID string as verl's (verl splits
  TransferQueue keys ``{uid}_{session}_{index}`` on ``_``, so a uid must not contain one), of version 8 (RFC 9562's
  custom UUIDs), which tells it from the ``uuid4`` verl gives validation prompts (:func:`is_run_uid`);
* :func:`request_seed`: a rollout request's sampling seed from (seed, step, uid, response index), which vLLM takes
  in ``SamplingParams.seed`` and the ``hf_cpu`` server in a generator of its own.

The hash is BLAKE2b over the parts' ``repr``, stable across processes, machines and Python versions (``hash()`` is
salted per process).
"""

from __future__ import annotations

import hashlib
import uuid

# vLLM's SamplingParams.seed and torch.Generator.manual_seed take any non-negative 63-bit integer.
SEED_BITS = 63


def _digest(*parts) -> bytes:
    text = "\x1f".join(repr(part) for part in parts)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def stable_seed(*parts) -> int:
    """A 63-bit seed that depends only on ``parts`` (ints and strings), the same in every process."""
    return int.from_bytes(_digest(*parts)[:8], "little") >> (64 - SEED_BITS)


def request_seed(run_seed: int, step: int, uid: str, response_index: int) -> int:
    """The sampling seed of response ``response_index`` of prompt ``uid`` at training step ``step``."""
    return stable_seed("request", int(run_seed), int(step), str(uid), int(response_index))


def prompt_uid(run_seed: int, step: int, fetch: int, row: int) -> str:
    """The uid of row ``row`` of the ``fetch``-th dataloader batch of step ``step``: unique in the run, the same in
    every run of that seed (a resume included). A version-8 UUID (the version and variant bits set as RFC 9562 says)."""
    raw = bytearray(_digest("prompt", int(run_seed), int(step), int(fetch), int(row)))
    raw[6] = (raw[6] & 0x0F) | 0x80  # version 8
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122/9562 variant
    return str(uuid.UUID(bytes=bytes(raw)))


def is_run_uid(uid: str) -> bool:
    """Whether ``uid`` was made by :func:`prompt_uid` (version 8), not by verl's ``uuid4`` (validation prompts)."""
    try:
        return uuid.UUID(str(uid)).version == 8
    except ValueError:
        return False


def content_key(*parts) -> str:
    """A hex digest of a prompt's content (its messages with their images, dataset index, ...): the stand-in for a
    uid that is drawn fresh per call (verl's validation), so that a validation request's seed is the same in every
    run. Images and arrays count by their bytes (a PIL image's ``repr`` holds its memory address)."""
    return _digest("content", *(_canonical(part) for part in parts)).hex()


def _canonical(value) -> str:
    """A text that depends on ``value``'s content only, the same in every process."""
    if value is None or isinstance(value, str | int | float | bool):
        return repr(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return "bytes:" + hashlib.blake2b(bytes(value), digest_size=16).hexdigest()
    if isinstance(value, dict):
        items = sorted((str(key), _canonical(item)) for key, item in value.items())
        return "{" + ",".join(f"{key}:{item}" for key, item in items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_canonical(item) for item in value) + "]"
    if hasattr(value, "tobytes"):  # PIL images, numpy arrays
        shape = getattr(value, "size", None) if hasattr(value, "mode") else getattr(value, "shape", None)
        kind = getattr(value, "mode", None) or str(getattr(value, "dtype", ""))
        digest = hashlib.blake2b(value.tobytes(), digest_size=16).hexdigest()
        return f"{type(value).__name__}:{kind}:{shape}:{digest}"
    if hasattr(value, "tolist"):  # numpy scalars, tensors
        return _canonical(value.tolist())
    # Anything else counts by its type alone (its repr may hold an address): still the same in every run.
    return f"<{type(value).__module__}.{type(value).__qualname__}>"
