"""Image files: decoding with Pillow, and pooled decoding of small folders (their listing: data/listing.py).

Every image, whatever its Pillow mode (1, L, P, RGB, RGBA, CMYK, I;16, ...), becomes uint8 RGB or L.
Alpha is dropped as torchvision's ImageFolder does (`convert("RGB")`); 16-bit grayscale is scaled
to 8 bits rather than clipped.  A file Pillow cannot fully decode (corrupt, truncated, empty) raises
`BadImageError` naming the file, and an image whose header claims more pixels than `max_pixels` is
refused before any pixel is decoded (decompression-bomb guard, like Pillow's `MAX_IMAGE_PIXELS`).
An EXIF Orientation tag is applied, so a phone's portrait photo is read upright, as a viewer shows it.
Files are untrusted input: only the formats of IMAGE_EXTENSIONS are opened (`FORMATS`; Pillow's other
plugins, EPS through Ghostscript among them, never see the bytes), a header claiming an empty image
is refused, a palette with transparency goes through RGBA, and a 1x1 image is resized like any other.

JPEGs decoded to RGB go through `simplejpeg` (libjpeg-turbo, the `jpeg` extra) when it is installed,
with the same power-of-two DCT-domain scaling Pillow's `draft` uses, so the pixels are identical and
only the time differs (benchmarks/data_pipeline.py: 1.5-4x on 32 px JPEGs); anything it declines
(CMYK, damaged data, a scale it would choose differently) falls back to Pillow.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import re
import stat
import threading
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from vitkit.data.jpeg import MAX_JPEG_SCANS, jpeg_scans
from vitkit.data.pixels import GRAY_MODES, resize_center_crop, to_mode
from vitkit.host import cpus

try:  # optional: the `jpeg` extra
    import simplejpeg as _simplejpeg
except ImportError:  # pragma: no cover - depends on the environment
    _simplejpeg = None

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
FORMATS = ("JPEG", "PNG", "BMP", "GIF", "WEBP", "TIFF", "PPM")  # Pillow plugins of IMAGE_EXTENSIONS; no others
MAX_PIXELS = 89_478_485  # Pillow's default Image.MAX_IMAGE_PIXELS (about 0.25 GiB of 24-bit pixels)
ORIENTATION = 0x0112  # the EXIF tag: 1 as stored, 2-8 mirrored and/or turned (ImageOps.exif_transpose undoes it)
_MAX_LOGGED = 10  # bad files named one by one in the log; the rest only counted


class BadImageError(ValueError):
    """An image file that cannot be decoded (corrupt, truncated, empty, or not an image)."""


class DecompressionBombError(BadImageError):
    """An image whose header claims more pixels than the configured limit."""


class NoLabelsError(ValueError):
    """A labelled reading of a source that holds no labels (it reads without them: `labelled=False`)."""


def _source_name(source: str | os.PathLike | bytes) -> str:
    return "<bytes>" if isinstance(source, (bytes, bytearray, memoryview)) else str(source)


_BOMB_FILTER_LOCK = threading.Lock()
MAX_FILE_BYTES = 1 << 30  # an image file above this is refused unread (an uncompressed 16-bit RGB at MAX_PIXELS fits)


@contextlib.contextmanager
def _pillow_bomb_warning_off() -> Iterator[None]:
    """Pillow's DecompressionBombWarning off: `max_pixels` decides, and vitkit's refusal names the file.

    The filter joins the front of the process's list once (again if another came before it) and stays: the
    warning is off for the process once vitkit decodes.  `warnings.catch_warnings` swaps the whole list in and out,
    which threads (serve's decoders) race on: one's restore drops another's filter or leaves its own behind.
    """
    bomb = Image.DecompressionBombWarning
    with _BOMB_FILTER_LOCK:  # the first filter that applies to the warning must be this one
        first = next((f for f in warnings.filters if issubclass(bomb, f[2])), None)
        if first is None or first[0] != "ignore" or first[1] is not None or first[3] is not None:
            warnings.filterwarnings("ignore", category=bomb)
    yield


def _bomb(name: str, width: int, height: int, max_pixels: int) -> DecompressionBombError:
    return DecompressionBombError(
        f"{name}: refusing to decode a {width}x{height} image ({width * height:,} pixels > "
        f"limit {max_pixels:,}); possible decompression bomb"
    )


def _open(source: str | os.PathLike | bytes, max_pixels: int, name: str) -> Image.Image:
    """Open lazily (header only) and refuse decompression bombs and empty images before decoding any pixel."""
    handle = io.BytesIO(source) if isinstance(source, (bytes, bytearray, memoryview)) else source
    try:
        image = Image.open(handle, formats=FORMATS)
    except Image.DecompressionBombError as error:  # Pillow's own guard (twice its MAX_IMAGE_PIXELS) fired first
        claimed = re.search(r"Image size \((\d+) pixels\)", str(error))
        size = f"a {int(claimed.group(1)):,}-pixel image" if claimed else "an image"
        pillows = 2 * (Image.MAX_IMAGE_PIXELS or 0)
        limit = (
            f"{max_pixels:,}" if max_pixels <= pillows else f"{pillows:,}, Pillow's own, which max_pixels cannot raise"
        )
        raise DecompressionBombError(
            f"{name}: refusing to decode {size} (> limit {limit}); possible decompression bomb"
        ) from error
    except UnidentifiedImageError as error:  # its message shows a BytesIO's address, not the file
        raise BadImageError(f"{name}: not a readable image (no format Pillow reads recognises it)") from error
    except Exception as error:  # OSError, SyntaxError, ValueError, struct.error, ...: a damaged header
        raise BadImageError(f"{name}: not a readable image ({type(error).__name__}: {error})") from error
    width, height = image.size
    if width * height > max_pixels:
        image.close()
        raise _bomb(name, width, height, max_pixels)
    if width < 1 or height < 1:
        image.close()
        raise BadImageError(f"{name}: the header claims an empty {width}x{height} image")
    return image


def open_image(source: str | os.PathLike | bytes, max_pixels: int = MAX_PIXELS, name: str | None = None) -> Image.Image:
    """The image opened lazily (header read, no pixel decoded), refused as `decode_image` refuses it: beyond
    `max_pixels` (DecompressionBombError), unreadable or empty (BadImageError), the message naming `name`."""
    with _pillow_bomb_warning_off():
        return _open(source, max_pixels, name or _source_name(source))


def _draft_scale(width: int, height: int, size: int) -> int:
    """The DCT-domain reduction (8, 4, 2 or 1) Pillow's JPEG `draft` picks so that the shorter side stays >= size."""
    short = min(width, height)
    wanted = (math.ceil(size * width / short), math.ceil(size * height / short))
    room = min(width // wanted[0], height // wanted[1])
    return next(scale for scale in (8, 4, 2, 1) if scale <= max(room, 1))


def _decode_jpeg_fast(data: bytes, size: int | None, max_pixels: int, name: str) -> Image.Image | None:
    """RGB JPEG bytes -> image via simplejpeg at Pillow's draft scale (identical pixels), or None to use Pillow."""
    if _simplejpeg is None or data[:3] != b"\xff\xd8\xff":
        return None
    try:
        height, width, colorspace, _ = _simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None  # Pillow names the problem
    if colorspace not in ("YCbCr", "RGB", "Gray"):
        return None  # CMYK/YCCK: Pillow's conversion
    if width * height > max_pixels:
        raise _bomb(name, width, height, max_pixels)
    if width < 1 or height < 1 or _turned(data):
        return None  # Pillow names the problem, or applies the orientation
    scale = _draft_scale(width, height, size) if size is not None else 1
    shape = (-(-height // scale), -(-width // scale))
    try:
        array = _simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=shape[0], min_width=shape[1], strict=True)
    except (ValueError, TypeError):  # damaged data (Pillow names it), or a simplejpeg without `strict`
        return None
    if array.shape[:2] != shape:  # libjpeg-turbo chose an M/8 scale Pillow would not: keep Pillow's pixels
        return None
    return Image.fromarray(array, "RGB")


def _turned(data: bytes) -> bool:
    """Whether a JPEG's EXIF block (in its first segments) orients it other than as stored; no pixel is read."""
    if b"Exif\x00\x00" not in data[: 1 << 16]:
        return False
    try:
        with Image.open(io.BytesIO(data), formats=("JPEG",)) as image:
            return image.getexif().get(ORIENTATION, 1) != 1
    except Exception:  # a damaged header: Pillow's decode names it
        return True


def upright(image: Image.Image) -> Image.Image:
    """The decoded image as its EXIF orientation says a viewer shows it (unchanged without one)."""
    try:
        orientation = image.getexif().get(ORIENTATION, 1)
    except Exception:  # a damaged EXIF block: the pixels as stored
        return image
    return ImageOps.exif_transpose(image) if orientation in range(2, 9) else image


def check_file(path: str | os.PathLike, name: str) -> None:
    """A path to decode must be a regular file of at most MAX_FILE_BYTES: a path from data (a Hugging Face row's
    `path`) can name /dev/zero, a FIFO or any large file.  A missing file is left to the reader, which names it."""
    try:
        info = os.stat(path)
    except OSError:
        return
    if not stat.S_ISREG(info.st_mode):
        raise BadImageError(f"{name}: not a regular file (a device, FIFO or directory is not an image)")
    if info.st_size > MAX_FILE_BYTES:
        raise BadImageError(f"{name}: {info.st_size:,} bytes, larger than an image file may be ({MAX_FILE_BYTES:,})")


def _read_source(source: str | os.PathLike | bytes) -> bytes | str | os.PathLike:
    """The bytes of a JPEG-looking file (for the fast decoder); other sources unchanged."""
    if _simplejpeg is None or isinstance(source, (bytes, bytearray, memoryview)):
        return source
    try:
        with open(source, "rb") as handle:
            return handle.read()
    except OSError:
        return source  # Pillow raises the error, naming the file


def _check_scans(
    data: bytes | bytearray | memoryview | str | os.PathLike, name: str
) -> bytes | bytearray | memoryview | str | os.PathLike:
    """`data`, or a JPEG file's bytes (read once, for the check and the decoder); a BadImageError for a JPEG of
    more than MAX_JPEG_SCANS scans, before any is decoded."""
    if isinstance(data, (str, os.PathLike)):
        try:
            with open(data, "rb") as handle:
                head = handle.read(2)
                if head != b"\xff\xd8":
                    return data
                data = head + handle.read()
        except OSError:
            return data  # the decoder names the file
    if bytes(data[:2]) == b"\xff\xd8" and jpeg_scans(data) > MAX_JPEG_SCANS:
        raise BadImageError(f"{name}: a JPEG of over {MAX_JPEG_SCANS} scans (each decodes the whole image again)")
    return data


def _decode(
    source: str | os.PathLike | bytes, channels: int, size: int | None, max_pixels: int, name: str | None = None
) -> np.ndarray:
    """(H, W, C) uint8 array; with `size`: shorter side resized to `size`, then centre-cropped square."""
    if not isinstance(source, (str, os.PathLike, bytes, bytearray, memoryview)):  # an int would be a file descriptor
        raise BadImageError(f"{name or '<value>'}: not an image (a {type(source).__name__} value)")
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    name = name or _source_name(source)
    if isinstance(source, (str, os.PathLike)):
        check_file(source, name)
    data = _read_source(source) if channels == 3 else source
    if isinstance(data, (bytes, bytearray, memoryview)) and not len(data):
        raise BadImageError(f"{name}: no image data (empty)")  # an empty file, or a row whose image is missing
    data = _check_scans(data, name)
    fast = (
        _decode_jpeg_fast(bytes(data), size, max_pixels, name)
        if isinstance(data, (bytes, bytearray, memoryview)) and channels == 3
        else None
    )
    image = fast if fast is not None else _open(data, max_pixels, name)
    try:
        with image:
            if fast is None and size is not None and image.format == "JPEG":
                # DCT-domain downscaling (1/2, 1/4, 1/8) while keeping the shorter side >= size: a large speed-up.
                short = min(image.size)
                image.draft(
                    "L" if channels == 1 else "RGB",
                    (math.ceil(size * image.size[0] / short), math.ceil(size * image.size[1] / short)),
                )
            image.load()  # the actual decode: raises on truncated or corrupt data
            image = upright(image)
            spread = channels == 3 and image.mode in GRAY_MODES  # resized as one channel, then spread to RGB
            image = to_mode(image, 1 if spread else channels)
            if size is not None:
                image = resize_center_crop(image, size)
            if spread:
                image = image.convert("RGB")
            array = np.array(image, dtype=np.uint8)  # a writable copy (torch wants one)
    except BadImageError:
        raise
    except Exception as error:  # OSError "image file is truncated", SyntaxError, ValueError, zlib errors ...
        raise BadImageError(f"{name}: corrupt or truncated image ({type(error).__name__}: {error})") from error
    return array[:, :, None] if array.ndim == 2 else array  # (H, W) -> (H, W, 1)


def decode_image(
    source: str | os.PathLike | bytes,
    channels: int = 3,
    *,
    size: int | None = None,
    max_pixels: int = MAX_PIXELS,
    name: str | None = None,
) -> torch.Tensor:
    """Decode one image file (or its bytes) to uint8 (C, H, W).

    Args:
        source: a path or the encoded bytes.
        channels: 3 for RGB, 1 for grayscale ("L"); every Pillow mode is converted.
        size: if given, resize the shorter side to `size` and centre-crop to (size, size).
        max_pixels: refuse images whose header claims more pixels (decompression bombs).
        name: what error messages call the image (default: the path, or "<bytes>").

    Raises:
        BadImageError: the data is not a decodable image; the message names the file.
        DecompressionBombError: the image is larger than `max_pixels`.
    """
    with _pillow_bomb_warning_off():
        array = _decode(source, channels, size, max_pixels, name)
    return torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))  # (H, W, C) -> (C, H, W)


@contextlib.contextmanager
def _header(source: Path | bytes | str) -> Iterator[Image.Image]:
    """The image opened for its header (a path, which must be a regular file (`check_file`), or encoded bytes)
    by the plugins of FORMATS alone, Pillow's bomb warning off."""
    if not isinstance(source, (bytes, bytearray)):
        check_file(source, str(source))
    opened = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source
    with _pillow_bomb_warning_off(), Image.open(opened, formats=FORMATS) as image:
        yield image


def image_size(path: Path | bytes) -> tuple[int, int] | None:
    """(width, height) from the header alone, or None if the file (or bytes) does not open."""
    try:
        with _header(path) as image:
            return image.size
    except Exception:  # noqa: BLE001 - any unreadable file just has no size
        return None


def spread(count: int, probed: int) -> list[int]:
    """`probed` positions spread evenly over `count` rows, to probe: rows are often sorted by class, and the first
    few of one class (a grayscale one, a smaller one) said the channels and side of the whole split."""
    taken = min(probed, count)
    return [round(k * (count - 1) / (taken - 1)) for k in range(taken)] if taken > 1 else list(range(taken))


def probe_images(sources: Sequence[Path | bytes | str]) -> tuple[int, int]:
    """(median shorter side, channels) of a few encoded images, from their headers; channels is 1 when all
    are grayscale, else 3.  (0, 3) when none opens."""
    sides, gray = [], True
    for source in sources:
        try:
            with _header(source) as image:
                sides.append(min(image.size))
                gray = gray and image.mode in ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F")
        except Exception:  # noqa: BLE001 - an unreadable sample says nothing about the others
            continue
    sides.sort()
    return (sides[len(sides) // 2], 1 if gray else 3) if sides else (0, 3)


# ------------------------------------------------------------------------------------- folders
def decode_workers() -> int:
    """Decoding threads by default: one a CPU this process may use (its affinity), at most 8."""
    return min(8, cpus())


def decode_files(
    files: Sequence[Path | bytes],
    channels: int,
    size: int,
    *,
    strict: bool = False,
    num_workers: int | None = None,
    max_pixels: int = MAX_PIXELS,
    names: Sequence[str] | None = None,
) -> tuple[torch.Tensor, list[int], list[str]]:
    """Decode `files` (paths, or encoded bytes called `names` in messages) to one uint8 (N_good, C, size, size)
    tensor with a thread pool.

    Pillow releases the GIL while decoding and resizing, so threads scale without pickling pixels
    between processes.  Returns the tensor, the positions (into `files`) that decoded and the error
    of each one that did not (naming its file); those are logged, the first few by name (or, with
    `strict`, the first raises `BadImageError`).
    """
    out = torch.empty(len(files), channels, size, size, dtype=torch.uint8)
    workers = num_workers or decode_workers()

    def work(i: int) -> str | None:
        try:
            name = names[i] if names is not None else None
            out[i] = torch.from_numpy(_decode(files[i], channels, size, max_pixels, name).transpose(2, 0, 1))
        except BadImageError as error:
            if strict:
                raise
            return str(error)
        return None

    with _pillow_bomb_warning_off(), ThreadPoolExecutor(workers) as pool:  # once: warning filters are process-wide
        errors = list(pool.map(work, range(len(files))))
    bad = [i for i, error in enumerate(errors) if error is not None]
    for i in bad[:_MAX_LOGGED]:
        log.warning("skipping bad image %s", errors[i])
    if bad:
        log.warning("skipped %d of %d image files that could not be decoded", len(bad), len(files))
    good = [i for i, error in enumerate(errors) if error is None]
    return (out if not bad else out[good]), good, [errors[i] for i in bad]
