"""Online image perturbations for DIVA's harder variants (docs/algo/diva_grpo.md).

Every perturbation is a pure function ``f(image, **params) -> image`` on an RGB ``PIL.Image``:

=================  ==========================  =====================================================
name               params                      effect (pixel values on a 0..1 scale)
=================  ==========================  =====================================================
``rotate``         ``degrees``                 rotate by the true angle (positive = counter-clockwise,
                                               PIL's convention), canvas expanded, border colour as fill
``gaussian_noise`` ``sigma``, ``seed``         ``x + sigma * N(0, 1)``, clipped to [0, 1]
``salt_pepper``    ``amount``, ``seed``        a fraction ``amount`` of pixels set to black or white
                                               (half each), all channels of a pixel together
``speckle``        ``sigma``, ``seed``         ``x + x * sigma * N(0, 1)``, clipped to [0, 1]
``blur``           ``radius_frac``             Gaussian blur, radius = ``radius_frac`` x shorter side
``low_resolution`` ``reduction``               downscale to ``1 - reduction`` of each side, upscale back
``text_band``      ``text``, ``position``,     the text drawn in black into a white band added above
                   ``font_frac``               (``"top"``) or below (``"bottom"``); font size =
                                               ``font_frac`` x image width
=================  ==========================  =====================================================

Guarantees (tested): the strength parameter at 0 (or empty text) returns the input pixels unchanged;
channels stay in RGB order (the authors' released code swapped red and blue through OpenCV); the
random ones draw only from ``np.random.default_rng(seed)``, so the recorded params replay the exact
image; :func:`apply_perturbations` downscales the result to at most ``max_pixels`` keeping the
aspect ratio (rotation with an expanded canvas and the text band both grow the image).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache
from statistics import NormalDist
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont


def _as_rgb(image: Image.Image) -> Image.Image:
    return image if image.mode == "RGB" else image.convert("RGB")


def _from_unit_float(values: np.ndarray) -> Image.Image:
    """float32 array on a 0..255 scale -> RGB image (rounded, clipped)."""
    np.clip(values, 0.0, 255.0, out=values)
    np.rint(values, out=values)
    return Image.fromarray(values.astype(np.uint8), mode="RGB")


def border_colour(image: Image.Image) -> tuple[int, int, int]:
    """Per-channel median of the outermost ring of pixels: the colour a rotated canvas is filled with."""
    pixels = np.asarray(_as_rgb(image))
    ring = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]], axis=0)
    return tuple(int(v) for v in np.median(ring, axis=0))


def rotate(image: Image.Image, *, degrees: float) -> Image.Image:
    """Rotate by ``degrees`` (counter-clockwise when positive), expanding the canvas to keep every pixel."""
    image = _as_rgb(image)
    if degrees % 360 == 0:
        return image
    return image.rotate(degrees, resample=Image.Resampling.BILINEAR, expand=True, fillcolor=border_colour(image))


# Standard-normal draws by table look-up: N(0, 1) quantiles at the centres of 2^16 equal-probability bins,
# indexed with uniform 16-bit integers. Same distribution (quantised to 65,536 levels, |z| <= 4.2) as
# ``standard_normal`` at about a third of its cost on a megapixel image, which keeps the DataLoader workers'
# time per prompt within budget.
_NORMAL_LEVELS = 1 << 16


@lru_cache(maxsize=1)
def _normal_quantiles() -> np.ndarray:
    centres = (np.arange(_NORMAL_LEVELS, dtype=np.float64) + 0.5) / _NORMAL_LEVELS
    inv_cdf = NormalDist().inv_cdf
    return np.array([inv_cdf(p) for p in centres], dtype=np.float32)


def _standard_normal_indices(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, _NORMAL_LEVELS, size=shape, dtype=np.uint16)


def gaussian_noise(image: Image.Image, *, sigma: float, seed: int) -> Image.Image:
    """Additive Gaussian noise with standard deviation ``sigma`` on the 0..1 pixel scale."""
    image = _as_rgb(image)
    if sigma == 0:
        return image
    pixels = np.asarray(image, dtype=np.int16)
    # Integer arithmetic throughout: round(x + n) == x + round(n) for integer pixels x.
    noise_levels = np.rint(_normal_quantiles() * np.float32(sigma * 255.0)).astype(np.int16)
    noisy = pixels + noise_levels[_standard_normal_indices(seed, pixels.shape)]
    np.clip(noisy, 0, 255, out=noisy)
    return Image.fromarray(noisy.astype(np.uint8), mode="RGB")


def salt_pepper(image: Image.Image, *, amount: float, seed: int) -> Image.Image:
    """Set a fraction ``amount`` of pixels to black (first half) or white (second half)."""
    image = _as_rgb(image)
    if amount == 0:
        return image
    pixels = np.array(image)  # writable copy
    draw = np.random.default_rng(seed).random(pixels.shape[:2], dtype=np.float32)
    pixels[draw < amount / 2] = 0
    pixels[(draw >= amount / 2) & (draw < amount)] = 255
    return Image.fromarray(pixels, mode="RGB")


def speckle(image: Image.Image, *, sigma: float, seed: int) -> Image.Image:
    """Multiplicative noise ``x * (1 + sigma * N(0, 1))``."""
    image = _as_rgb(image)
    if sigma == 0:
        return image
    pixels = np.asarray(image, dtype=np.float32)
    factor = _normal_quantiles()[_standard_normal_indices(seed, pixels.shape)]
    factor *= np.float32(sigma)
    factor += np.float32(1.0)
    factor *= pixels
    return _from_unit_float(factor)


_HALF_RES_BLUR_RADIUS = 4.0


def blur(image: Image.Image, *, radius_frac: float) -> Image.Image:
    """Gaussian blur whose radius is ``radius_frac`` of the shorter side (so it scales with resolution)."""
    image = _as_rgb(image)
    radius = radius_frac * min(image.size)
    if radius == 0:
        return image
    if radius < _HALF_RES_BLUR_RADIUS:
        return image.filter(ImageFilter.GaussianBlur(radius=radius))
    # A blur this wide leaves nothing above half the sampling rate: blur at half resolution (a quarter of the
    # work) and scale back, which is indistinguishable after the blur.
    small = image.reduce(2)
    blurred = small.filter(ImageFilter.GaussianBlur(radius=radius / 2))
    return blurred.resize(image.size, Image.Resampling.BILINEAR)


def low_resolution(image: Image.Image, *, reduction: float) -> Image.Image:
    """Lose detail: shrink each side to ``1 - reduction`` of its length, then scale back to the input size."""
    image = _as_rgb(image)
    if reduction == 0:
        return image
    if not 0 <= reduction < 1:
        raise ValueError(f"low_resolution: reduction must be in [0, 1), got {reduction}")
    width, height = image.size
    small = (max(1, round(width * (1 - reduction))), max(1, round(height * (1 - reduction))))
    return image.resize(small, Image.Resampling.BOX).resize((width, height), Image.Resampling.BILINEAR)


@lru_cache(maxsize=32)
def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    # Pillow's bundled font (FreeType build): no font file on disk needed.
    return ImageFont.load_default(size=size)


def _wrap(text: str, font, max_width: float) -> list[str]:
    """Greedy word wrap; a single word wider than the line is split by characters."""
    lines: list[str] = []
    for paragraph in text.splitlines() or [""]:
        line = ""
        for word in paragraph.split():
            candidate = f"{line} {word}" if line else word
            if font.getlength(candidate) <= max_width:
                line = candidate
                continue
            if line:
                lines.append(line)
            line = ""
            for char in word:
                if font.getlength(line + char) > max_width and line:
                    lines.append(line)
                    line = ""
                line += char
        lines.append(line)
    return lines


def text_band(image: Image.Image, *, text: str, position: str = "bottom", font_frac: float = 0.025) -> Image.Image:
    """Add a white band above or below the image with ``text`` drawn in black, word-wrapped to the width."""
    image = _as_rgb(image)
    text = text.strip()
    if not text:
        return image
    if position not in ("top", "bottom"):
        raise ValueError(f"text_band: position must be 'top' or 'bottom', got {position!r}")
    width, height = image.size
    font = _font(max(10, round(font_frac * width)))
    padding = max(4, font.size // 2)
    lines = _wrap(text, font, max(1, width - 2 * padding))
    ascent, descent = font.getmetrics()
    line_height = ascent + descent + max(1, font.size // 5)
    band_height = len(lines) * line_height + 2 * padding
    canvas = Image.new("RGB", (width, height + band_height), (255, 255, 255))
    canvas.paste(image, (0, band_height if position == "top" else 0))
    draw = ImageDraw.Draw(canvas)
    top = padding if position == "top" else height + padding
    for i, line in enumerate(lines):
        draw.text((padding, top + i * line_height), line, fill=(0, 0, 0), font=font)
    return canvas


PERTURBATIONS: dict[str, Callable[..., Image.Image]] = {
    "rotate": rotate,
    "gaussian_noise": gaussian_noise,
    "salt_pepper": salt_pepper,
    "speckle": speckle,
    "blur": blur,
    "low_resolution": low_resolution,
    "text_band": text_band,
}

# The strength parameter of each perturbation (0 = identity); text_band's is its text ("" = identity).
STRENGTH_PARAM = {
    "rotate": "degrees",
    "gaussian_noise": "sigma",
    "salt_pepper": "amount",
    "speckle": "sigma",
    "blur": "radius_frac",
    "low_resolution": "reduction",
    "text_band": "text",
}


def limit_pixels(image: Image.Image, max_pixels: int | None) -> Image.Image:
    """Downscale (keeping the aspect ratio) so that width x height <= ``max_pixels``; smaller images pass."""
    width, height = image.size
    if not max_pixels or width * height <= max_pixels:
        return image
    scale = math.sqrt(max_pixels / (width * height))
    new_w, new_h = max(1, math.floor(width * scale)), max(1, math.floor(height * scale))
    while new_w * new_h > max_pixels:  # floor rounding can leave one row too many
        new_h -= 1
    return image.resize((new_w, new_h), Image.Resampling.BILINEAR, reducing_gap=2.0)


def apply_perturbations(
    image: Image.Image, perturbations: Sequence[tuple[str, dict[str, Any]]], max_pixels: int | None = None
) -> Image.Image:
    """Apply ``[(name, params), ...]`` in order, then :func:`limit_pixels` (only when something was applied)."""
    out = _as_rgb(image)
    for name, params in perturbations:
        try:
            fn = PERTURBATIONS[name]
        except KeyError:
            raise ValueError(f"unknown perturbation {name!r}; known: {sorted(PERTURBATIONS)}") from None
        if name == "rotate":
            # Shrink before rotating rather than after: the expanded canvas would be shrunk to max_pixels anyway,
            # and rotating the smaller image costs half as much on a megapixel input.
            out = _fit_rotation(out, params["degrees"], max_pixels)
        out = fn(out, **params)
    return limit_pixels(out, max_pixels) if perturbations else out


def _fit_rotation(image: Image.Image, degrees: float, max_pixels: int | None) -> Image.Image:
    """Downscale ``image`` so that its canvas rotated by ``degrees`` (expanded) holds at most ``max_pixels``."""
    if not max_pixels:
        return image
    width, height = image.size
    c, s = abs(math.cos(math.radians(degrees))), abs(math.sin(math.radians(degrees)))
    rotated_area = (width * c + height * s) * (width * s + height * c)
    if rotated_area <= max_pixels:
        return image
    scale = math.sqrt(max_pixels / rotated_area)
    size = (max(1, math.floor(width * scale)), max(1, math.floor(height * scale)))
    return image.resize(size, Image.Resampling.BILINEAR, reducing_gap=2.0)
