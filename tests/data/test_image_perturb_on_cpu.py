"""Image perturbations: identity at strength 0, RGB order, pixel statistics, rotation geometry, size limit."""

import math

import numpy as np
import pytest
from PIL import Image

from verl_ext.data.perturb import (
    PERTURBATIONS,
    STRENGTH_PARAM,
    apply_perturbations,
    border_colour,
    limit_pixels,
    rotate,
)

SEEDED = {"gaussian_noise", "salt_pepper", "speckle"}


def flat(colour, size=(96, 64)) -> Image.Image:
    return Image.new("RGB", size, colour)


def textured(size=(96, 64), seed=0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB")


def px(image) -> np.ndarray:
    return np.asarray(image, dtype=np.float64)


def strong_params(name: str) -> dict:
    return {
        "rotate": {"degrees": 33.0},
        "gaussian_noise": {"sigma": 0.1, "seed": 7},
        "salt_pepper": {"amount": 0.1, "seed": 7},
        "speckle": {"sigma": 0.2, "seed": 7},
        "blur": {"radius_frac": 0.05},
        "low_resolution": {"reduction": 0.75},
        "text_band": {"text": "Find x.", "position": "top", "font_frac": 0.1},
    }[name]


@pytest.mark.parametrize("name", sorted(PERTURBATIONS))
def test_strength_zero_is_exactly_the_identity(name):
    image = textured()
    params = strong_params(name)
    params[STRENGTH_PARAM[name]] = "" if name == "text_band" else 0
    out = PERTURBATIONS[name](image, **params)
    assert out.size == image.size and out.mode == "RGB"
    assert np.array_equal(px(out), px(image))


@pytest.mark.parametrize("name", sorted(PERTURBATIONS))
def test_strength_changes_pixels_and_is_deterministic(name):
    image = textured()
    params = strong_params(name)
    first = PERTURBATIONS[name](image, **params)
    again = PERTURBATIONS[name](image, **params)
    assert np.array_equal(px(first), px(again))
    if first.size == image.size:
        assert np.abs(px(first) - px(image)).mean() > 1.0
    if name in SEEDED:
        other = PERTURBATIONS[name](image, **{**params, "seed": 8})
        assert not np.array_equal(px(first), px(other))


@pytest.mark.parametrize("name", ["gaussian_noise", "speckle", "blur", "low_resolution", "salt_pepper"])
def test_channels_stay_in_rgb_order(name):
    # The released code swapped red and blue through OpenCV; a distinct colour per channel catches that.
    colour = (200, 40, 110)
    out = px(PERTURBATIONS[name](flat(colour), **strong_params(name)))
    if name == "salt_pepper":  # untouched pixels keep their exact colour
        untouched = ~np.all((out == 0) | (out == 255), axis=-1)
        assert np.array_equal(out[untouched], np.broadcast_to(colour, out[untouched].shape))
    else:
        assert np.allclose(out.reshape(-1, 3).mean(0), colour, atol=4.0)


def test_gaussian_noise_std_matches_sigma():
    out = px(PERTURBATIONS["gaussian_noise"](flat((128, 128, 128), (256, 256)), sigma=0.1, seed=1))
    assert abs(out.std() - 0.1 * 255) < 0.05 * 0.1 * 255
    assert abs(out.mean() - 128) < 0.5


def test_speckle_std_scales_with_brightness():
    out = px(PERTURBATIONS["speckle"](flat((100, 100, 100), (256, 256)), sigma=0.2, seed=1))
    assert abs(out.std() - 0.2 * 100) < 0.05 * 0.2 * 100


def test_salt_pepper_hits_the_requested_fraction_half_each():
    out = px(PERTURBATIONS["salt_pepper"](flat((128, 128, 128), (256, 256)), amount=0.2, seed=3))
    black = np.all(out == 0, axis=-1).mean()
    white = np.all(out == 255, axis=-1).mean()
    assert abs(black - 0.1) < 0.01 and abs(white - 0.1) < 0.01


def neighbour_energy(image) -> float:
    a = px(image)
    return float(np.abs(np.diff(a, axis=1)).mean() + np.abs(np.diff(a, axis=0)).mean())


@pytest.mark.parametrize("name", ["blur", "low_resolution"])
def test_blur_and_low_resolution_remove_detail(name):
    image = textured((128, 128))
    out = PERTURBATIONS[name](image, **strong_params(name))
    assert out.size == image.size
    assert neighbour_energy(out) < 0.5 * neighbour_energy(image)


@pytest.mark.parametrize("position", ["top", "bottom"])
def test_text_band_adds_white_band_with_dark_text_and_keeps_the_picture(position):
    image = textured((200, 100))
    out = PERTURBATIONS["text_band"](image, text="What is the value of x in the triangle?", position=position)
    band = out.size[1] - image.size[1]
    assert out.size[0] == image.size[0] and band > 0
    arr = px(out)
    band_px, picture = (arr[:band], arr[band:]) if position == "top" else (arr[-band:], arr[:-band])
    assert np.array_equal(picture, px(image))
    assert (band_px == 255).all(axis=-1).mean() > 0.7  # mostly white
    assert (band_px.max(axis=-1) < 100).sum() > 20  # some dark text pixels


def marker_centre(image, colour=(255, 0, 0)) -> tuple[float, float]:
    a = px(image)
    mask = np.abs(a - colour).max(axis=-1) < 60
    ys, xs = np.nonzero(mask)
    assert len(xs) > 10, "marker not found"
    return float(xs.mean()), float(ys.mean())


def expected_after_rotation(size, rotated_size, point, degrees) -> tuple[float, float]:
    """Where ``point`` lands after rotating counter-clockwise (on screen) by ``degrees`` about the centre."""
    (w, h), (w2, h2) = size, rotated_size
    dx, dy = point[0] - w / 2, point[1] - h / 2
    t = math.radians(degrees)
    return w2 / 2 + dx * math.cos(t) + dy * math.sin(t), h2 / 2 - dx * math.sin(t) + dy * math.cos(t)


def marker_picture(size=(160, 100), at=(130, 30)):
    image = Image.new("RGB", size, (255, 255, 255))
    arr = np.array(image)
    arr[at[1] - 4 : at[1] + 5, at[0] - 4 : at[0] + 5] = (255, 0, 0)
    return Image.fromarray(arr), (at[0] + 0.5, at[1] + 0.5)


@pytest.mark.parametrize("degrees", [30.0, 90.0, -50.0, 135.0])
def test_rotation_puts_the_marker_where_the_angle_says(degrees):
    image, centre = marker_picture()
    out = rotate(image, degrees=degrees)
    # expand=True: the canvas is the bounding box of the rotated picture
    t = math.radians(degrees)
    w, h = image.size
    assert abs(out.size[0] - (abs(w * math.cos(t)) + abs(h * math.sin(t)))) <= 2
    want = expected_after_rotation(image.size, out.size, centre, degrees)
    got = marker_centre(out)
    assert math.dist(got, want) < 1.5, (got, want)
    # the corners are filled with the border colour (white), not black
    assert px(out)[0, 0].tolist() == [255.0, 255.0, 255.0]


def test_rotation_fill_is_the_border_colour():
    image = flat((10, 200, 30), (80, 60))
    assert border_colour(image) == (10, 200, 30)
    out = px(rotate(image, degrees=45))
    assert np.allclose(out[0, 0], (10, 200, 30))


def test_limit_pixels_downscales_keeping_aspect_and_apply_respects_it():
    big = textured((400, 200))
    small = limit_pixels(big, 20_000)
    assert small.size[0] * small.size[1] <= 20_000
    assert abs(small.size[0] / small.size[1] - 2.0) < 0.02
    assert limit_pixels(big, 10**9) is big
    rotated = apply_perturbations(big, [("rotate", {"degrees": 30.0})], max_pixels=80_000)
    assert rotated.size[0] * rotated.size[1] <= 80_000
    assert apply_perturbations(big, [], max_pixels=100) is not None  # no perturbation: no resize
    assert apply_perturbations(big, [], max_pixels=100).size == big.size


def test_unknown_perturbation_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown perturbation 'swirl'"):
        apply_perturbations(textured(), [("swirl", {})])


def test_rotation_is_shrunk_before_rotating_to_fit_max_pixels():
    from verl_ext.data.perturb import apply_perturbations

    image = flat((90, 140, 200), (1000, 800))
    out = apply_perturbations(image, [("rotate", {"degrees": 30.0})], max_pixels=500_000)
    assert out.size[0] * out.size[1] <= 500_000
    # Nearly all of the budget is used: shrinking first loses no more resolution than shrinking after.
    assert out.size[0] * out.size[1] >= 0.97 * 500_000
