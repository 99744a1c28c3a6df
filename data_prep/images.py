"""Image checks shared by ``convert`` and ``validate``: decode with PIL, resolve paths without escaping a folder."""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from data_prep.quarantine import BadRow


def decode_size(data: bytes) -> tuple[int, int]:
    """Fully decode ``data`` (``load()``, not just the header, so truncated files fail) and return (width, height)."""
    if not data:
        raise BadRow("undecodable image: empty bytes")
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return image.size
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise BadRow(f"undecodable image: {type(exc).__name__}: {exc}") from None


def resolve_inside(root: Path, relative: str) -> Path:
    """``root / relative`` as an existing file that lies inside ``root`` (no ``..`` or absolute-path escape)."""
    if not relative:
        raise BadRow("broken image path: empty path and no bytes")
    if not isinstance(relative, str):
        raise BadRow(f"broken image path: expected a path string, got {type(relative).__name__}")
    root = root.resolve()
    try:  # a NUL byte raises ValueError, an over-long name OSError: both are this row's problem, not the run's
        candidate = (root / relative).resolve()
        is_file = candidate.is_file()
    except (OSError, ValueError) as exc:
        raise BadRow(f"broken image path: {relative!r} is not a usable path ({exc})") from None
    if not candidate.is_relative_to(root):
        raise BadRow(f"image path escapes the input folder: {relative!r} is outside {str(root)!r}")
    if not is_file:
        raise BadRow(f"broken image path: {relative!r} does not exist under {str(root)!r}")
    return candidate


def image_entry(value, root: Path) -> dict:
    """Normalise one image cell to the schema's ``{"bytes", "path"}`` and check that it decodes.

    Accepts what downloaded datasets hold: ``{"bytes": b, "path": p}`` (HF ``Image`` feature; bytes may be null,
    then ``p`` is read relative to ``root``), raw ``bytes``, or a path string relative to ``root``.
    The original bytes are kept (no re-encoding): decoding is only a check.
    """
    if isinstance(value, dict):
        data, path = value.get("bytes"), value.get("path") or ""
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data, path = bytes(value), ""
    elif isinstance(value, str):
        data, path = None, value
    elif value is None:
        raise BadRow("broken image: the image cell is null")
    else:
        raise BadRow(f"broken image: unsupported image cell of type {type(value).__name__}")
    if not data:
        file = resolve_inside(root, path)
        try:
            data = file.read_bytes()
        except OSError as exc:  # e.g. no read permission
            raise BadRow(f"broken image path: cannot read {path!r}: {exc}") from None
    decode_size(data)
    return {"bytes": bytes(data), "path": path}
