"""A decoded Pillow image to the pixels a model reads: any mode to 8-bit "L" or "RGB", and the centre square
at a side (the shorter side resized, then cropped)."""

from __future__ import annotations

import numpy as np
from PIL import Image

GRAY_MODES = frozenset({"L", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"})  # one channel, RGB the same in each
STRIP_PIXELS = 1 << 20  # a 16-bit or float image converts to 8 bits this many pixels at a time (to_8bit)
MAX_ASPECT = 8  # longer than this times its shorter side, an image is resampled in its centre square alone


def to_8bit(image: Image.Image) -> Image.Image:
    """16/32-bit integer or float grayscale (e.g. a 16-bit PNG) -> "L": 0..65535 mapped onto 0..255 instead of
    clipped at 255 (values above 65535 clip; NaN reads as 0), scaled when any pixel of the image passes 255; a
    float image whose pixels all lie in 0..1 is read as the unit range, 1.0 white.
    Worked in strips of STRIP_PIXELS: the whole image as float32 took 8 bytes a pixel beside it."""
    width, height = image.size
    rows = max(1, STRIP_PIXELS // max(width, 1))
    strips = [(top, min(top + rows, height)) for top in range(0, height, rows)]

    def strip(top: int, bottom: int) -> np.ndarray:
        array = np.array(image.crop((0, top, width, bottom)), dtype=np.float32)  # a writable copy
        return np.nan_to_num(array, copy=False, nan=0.0, posinf=65535.0, neginf=0.0)

    peak = max(strip(*rows).max(initial=0) for rows in strips)
    scale = 255.0 / 65535.0 if image.mode.startswith("I;16") or peak > 255 else 1.0
    if image.mode == "F" and peak <= 1.0:
        scale = 255.0  # a float image in the unit range (0..1), as scientific and HDR tools write them
    out = np.empty((height, width), dtype=np.uint8)
    for top, bottom in strips:
        array = strip(top, bottom)
        if scale != 1.0:
            array *= scale
        out[top:bottom] = np.clip(np.rint(array, out=array), 0, 255, out=array)
    return Image.fromarray(out, "L")


def to_mode(image: Image.Image, channels: int) -> Image.Image:
    """Any Pillow mode -> "L" (channels=1) or "RGB" (channels=3)."""
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        image = to_8bit(image)
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")  # Pillow's advice: palette transparency goes through RGBA
    target = "L" if channels == 1 else "RGB"
    if image.mode == target:
        return image
    try:
        return image.convert(target)
    except ValueError:  # no direct conversion (LAB -> L): through RGB
        return image.convert("RGB").convert(target)


def resize_center_crop(image: Image.Image, size: int) -> Image.Image:
    """Shorter side -> `size` (antialiased bilinear, Pillow's convolution resampler), then the centre square.

    An image longer than MAX_ASPECT times its width is resampled in its square only: Pillow's `box` is the
    square's region of the source, and each output pixel has the centre and filter it would have in the whole
    resized image (its fixed-point weights may round one level apart).  Resizing the whole of such an image took
    gigabytes: 1 KB of PNG, 300,000x1 pixels, is 19.2 million pixels wide at 64 px high.
    """
    width, height = image.size
    scale = size / min(width, height)
    new_w, new_h = max(size, round(width * scale)), max(size, round(height * scale))
    left, top = (new_w - size) // 2, (new_h - size) // 2
    if max(new_w, new_h) <= MAX_ASPECT * size:  # the whole image, then the square: the pixels of every release
        if (new_w, new_h) != (width, height):
            image = image.resize((new_w, new_h), Image.Resampling.BILINEAR)
        return image.crop((left, top, left + size, top + size))
    step_x, step_y = width / new_w, height / new_h
    box = (left * step_x, top * step_y, (left + size) * step_x, (top + size) * step_y)
    return image.resize((size, size), Image.Resampling.BILINEAR, box=box)
