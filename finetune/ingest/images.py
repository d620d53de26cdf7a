"""An image a record points to, opened where ingestion reads it: is it there, is it an image, is it sane.

A canonical image part (finetune/ingest/record_images.py) carries one of
  {"type": "image", "path": "/absolute/path.png"}   a file
  {"type": "image", "base64": "iVBORw0..."}          the bytes, base64-encoded
Anything wrong with one is an ImageRejected whose `reason` is the counted-reject key of the records report:

  missing_image      no file at the path (or it is a folder)
  empty_image        a zero-byte file or base64 string, or an image of zero width or height
  unreadable_image   not an image PIL knows, broken (bad base64, a CRC that fails, truncated pixel data)
  image_too_large    over MAX_IMAGE_PIXELS: a decompression bomb, or a scan no vision processor would use whole
  image_url_offline  a URL: finetune reads local files only (offline, reproducible)

`open_image` reads only the header (size, mode, format): cheap, so ingestion checks every image of every record
before tokenization and the report counts the bad ones. `check_image` adds PIL's `verify()` (every PNG chunk's CRC,
no pixel decoding). The pixels are decoded once, when the data stage encodes the record
(finetune/data/vision/images.py `load_image`), which raises the same ImageRejected for what only decoding finds
(a JPEG cut short).

No torch here; PIL is imported when an image is first opened.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings
from pathlib import Path

# PIL's own default limit (PIL.Image.MAX_IMAGE_PIXELS, 1024 * 1024 * 1024 // 4 // 3 = 89,478,485: about 9,459 x
# 9,459), read here as a constant so PIL's global is never changed. Decoded as RGB that is 268 MB for one image;
# every vision processor shrinks an image to a few megapixels at most (Qwen2-VL's largest budget is 12.8 MP), so
# anything larger is a decompression bomb (a small file that claims a huge size) or a scan to downsize first.
# PIL itself only warns up to twice this and refuses beyond; here both are one counted reject.
MAX_IMAGE_PIXELS = 89_478_485
URL_SCHEMES = ("http://", "https://", "ftp://", "s3://", "gs://")

REASONS = ("missing_image", "empty_image", "unreadable_image", "image_too_large", "image_url_offline",
           "image_count_mismatch")


class ImageRejected(Exception):
    """An image that cannot be used; `reason` is the counted-reject key (REASONS), `detail` one sentence."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def is_url(value: str) -> bool:
    return value.lower().startswith(URL_SCHEMES)


def url_message(url: str) -> str:
    """Why a URL image is refused, and what to do instead."""
    shown = url if len(url) <= 120 else url[:117] + "..."
    return (f"the image `{shown}` is a URL; finetune reads images from local files only (training runs offline "
            "and reads the same bytes every time): download the images next to the data file and give their "
            "paths (relative to the data file), e.g. {\"type\": \"image\", \"path\": \"images/0001.jpg\"}")


def describe(part: dict) -> str:
    """The image as a message names it: its path, or 'a base64 image (N characters)'."""
    if "path" in part:
        return f"`{part['path']}`"
    if "base64" in part:
        return f"a base64 image ({len(part['base64']):,} characters)"
    return "an image part with no path or base64"


def image_bytes(part: dict) -> bytes:
    """The bytes of an image part: its file read, or its base64 decoded. ImageRejected when there are none."""
    if "path" in part:
        path = Path(part["path"])
        if is_url(str(part["path"])):
            raise ImageRejected("image_url_offline", url_message(str(part["path"])))
        if not path.exists() or path.is_dir():
            raise ImageRejected("missing_image", f"no image file at `{path}`")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ImageRejected("unreadable_image", f"`{path}` cannot be read ({exc.strerror or exc})") from None
    elif "base64" in part:
        try:
            data = base64.b64decode(part["base64"], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ImageRejected("unreadable_image", f"{describe(part)} is not valid base64 ({exc})") from None
    else:
        raise ImageRejected("missing_image", "an image part with neither `path` nor `base64`")
    if not data:
        raise ImageRejected("empty_image", f"{describe(part)} is empty (zero bytes)")
    return data


def open_image(part: dict):
    """The image of `part` opened by PIL, header only (no pixels decoded yet). ImageRejected when it is missing,
    empty, not an image, or over MAX_IMAGE_PIXELS."""
    return open_bytes(image_bytes(part), describe(part))


def open_bytes(data: bytes, what: str):
    """`data` opened by PIL, header only; `what` names the image in a reject's detail."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():  # between 1x and 2x PIL's limit PIL warns; the size check below rejects
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:  # over twice PIL's limit; its message says the size
        found = re.search(r"\d+", str(exc))
        raise too_large(what, f"claims {int(found.group()):,} pixels" if found else "claims too many pixels") \
            from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        why = "not an image PIL can read" if isinstance(exc, UnidentifiedImageError) else f"broken ({exc})"
        raise ImageRejected("unreadable_image", f"{what} is {why}") from None
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        raise too_large(what, f"is {width:,} x {height:,} pixels")
    if not width or not height:
        raise ImageRejected("empty_image", f"{what} is {width} x {height} pixels")
    return image


def too_large(what: str, size: str) -> ImageRejected:
    return ImageRejected("image_too_large", f"{what} {size}, over the {MAX_IMAGE_PIXELS:,} that finetune (like PIL) "
                         "reads: a decompression bomb, or an image to downsize before training")


def check_image(part: dict) -> tuple[int, int]:
    """(width, height) of a usable image; ImageRejected otherwise. Reads the header and checks the file's
    structure (PIL's verify: a PNG's chunk CRCs, a GIF's blocks) without decoding its pixels."""
    image = open_image(part)
    try:
        image.verify()
    except Exception as exc:  # verify raises whatever the format's parser meets: struct.error, SyntaxError...
        raise ImageRejected("unreadable_image", f"{describe(part)} is broken ({exc or type(exc).__name__})") from None
    return image.size
