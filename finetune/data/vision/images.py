"""An image part decoded for the processor: load_image(part) -> an RGB PIL image, the way a camera meant it.

  first frame   an animated GIF / APNG / WebP gives its first frame (a frame a model is shown is a still)
  orientation   the EXIF Orientation tag applied (a phone's portrait photo is stored sideways)
  colour        every mode to 8-bit RGB: CMYK, palette, 1-bit and grey converted; 16-bit grey scaled into 8 bits
                (PIL's plain convert clips it: everything over 255 turns white); an alpha channel (RGBA, LA,
                a palette with transparency) composited onto white, as transformers' convert_to_rgb does
  pixels        resized keeping the aspect ratio so that width * height <= max_pixels (and >= min_pixels)
                when given; a JPEG larger than the budget is decoded at 1/2, 1/4 or 1/8 scale first (PIL's draft),
                so a 50-megapixel photo costs about what a 1-megapixel one does

Everything wrong with an image is an ImageRejected (finetune/ingest/images.py) whose `reason` is a counted-reject
key; ingestion already checked each image's header and structure at read time, so what is left here is what only
decoding finds (pixel data cut short).

The image parts of a record (`image_parts`) and the reject (`ImageRejected`) live in ingestion, which checks the
images before tokenization; they are re-exported here for the data stage.
"""

from __future__ import annotations

import math

from finetune.ingest.images import ImageRejected, describe, image_bytes, open_image
from finetune.ingest.record_images import image_parts

__all__ = ["ImageRejected", "budget_size", "image_files_stamp", "image_parts", "images_digest", "load_image"]

ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")
WIDE_GREY_MODES = ("I", "I;16", "I;16L", "I;16B", "I;16N", "F")  # 16-bit / 32-bit integer / float grey


def load_image(part: dict, *, max_pixels: int | None = None, min_pixels: int | None = None):
    """The image of a canonical image part ({"type": "image", "path" | "base64"}) as an 8-bit RGB PIL image,
    EXIF-rotated, resized into [min_pixels, max_pixels] keeping its aspect ratio. Raises ImageRejected."""
    from PIL import ImageOps

    image = open_image(part)
    try:
        if max_pixels and image.size[0] * image.size[1] > max_pixels:
            image.draft(None, budget_size(*image.size, max_pixels, None))  # JPEG only; others ignore it
        image.load()  # the first frame: a freshly opened animation sits on frame 0
        image = to_rgb(ImageOps.exif_transpose(image))
    except ImageRejected:
        raise
    except Exception as exc:  # a decoder fails with OSError, SyntaxError, ValueError, struct.error...
        raise ImageRejected("unreadable_image", f"{describe(part)} cannot be decoded ({exc or type(exc).__name__})") \
            from None
    size = budget_size(*image.size, max_pixels, min_pixels)
    if size != image.size:
        from PIL import Image

        image = image.resize(size, Image.Resampling.BICUBIC)
    return image


def to_rgb(image):
    """Any PIL mode as 8-bit RGB."""
    from PIL import Image

    if image.mode == "RGB":
        return image
    if image.mode in WIDE_GREY_MODES:
        scale = _grey_scale(image)
        wide = image if image.mode in ("I", "F") else image.convert("I")
        return wide.point(lambda v: v * scale).convert("L").convert("RGB")
    if image.mode in ALPHA_MODES or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def _grey_scale(image) -> float:
    """The factor that brings a wide grey image's values into 0..255."""
    if image.mode.startswith("I;16"):
        return 255 / 65535  # 16-bit: 65535 is white
    _, high = image.getextrema()
    if image.mode == "F" and high <= 1.0:
        return 255.0  # a float image in 0..1
    return 1.0 if high <= 255 else 255 / 65535 if high <= 65535 else 255 / high  # 8 or 16 bits stored as int32


def budget_size(width: int, height: int, max_pixels: int | None, min_pixels: int | None) -> tuple[int, int]:
    """(width, height) scaled by one factor so that their product is at most max_pixels (at least min_pixels when
    the image is smaller), each at least 1; the size itself when it is inside the budget."""
    pixels = width * height
    if min_pixels and pixels < min_pixels:
        scale = math.sqrt(min_pixels / pixels)
        width, height = math.ceil(width * scale), math.ceil(height * scale)
        pixels = width * height
    if max_pixels and pixels > max_pixels:
        scale = math.sqrt(max_pixels / pixels)
        width, height = max(1, math.floor(width * scale)), max(1, math.floor(height * scale))
        width, height = max(1, min(width, max_pixels // height)), max(1, min(height, max_pixels // width))
    return width, height


def images_digest(items: list[list[dict]]) -> str:
    """One hash over the bytes of every item's images, in order: what a cache of numbers computed from the images
    (the preference reference log-probs) keys on, since an image edited in place keeps its path. An image in the
    records cache is named by its bytes' sha256 already (finetune/ingest/record_images.py image_store): not read."""
    import hashlib

    digest, known = hashlib.sha256(), {}
    for parts in items:
        for part in parts:
            where = part.get("path") or hashlib.sha256(part.get("base64", "").encode()).hexdigest()
            if where not in known:
                known[where] = _stored_name(part) or _bytes_hash(part)
            digest.update(known[where].encode())
        digest.update(b"\n")
    return digest.hexdigest()


def image_files_stamp(rows) -> str:
    """One hash over the size and modification time of each image file that rows' parts name (`rows`: each row's
    parts as JSON text, the `images` column): what tokenized rows keep beside them, since an image edited in place
    keeps its path while its count of image tokens may change (other tiles, another grid); a file gone counts too.
    Its metadata, not its bytes: checked each time the rows are reused."""
    import hashlib
    import json
    import os

    digest, seen = hashlib.sha256(), set()
    for row in rows:
        for part in json.loads(row or "[]"):
            path = part.get("path")
            if path and path not in seen:
                seen.add(path)
                try:
                    stat = os.stat(path)
                    mark = f"{stat.st_size}:{stat.st_mtime_ns}"
                except OSError:
                    mark = "missing"
                digest.update(f"{path}\0{mark}\n".encode())
    return digest.hexdigest()


def _stored_name(part: dict) -> str | None:
    """The sha256 an image in the records cache's store is named by (cache_dir/ingested/images/<sha256>.<format>)."""
    from pathlib import Path

    path = Path(part.get("path") or "")
    return path.stem if path.parent.parts[-2:] == ("ingested", "images") and len(path.stem) == 64 else None


def _bytes_hash(part: dict) -> str:
    import hashlib

    try:
        return hashlib.sha256(image_bytes(part)).hexdigest()
    except ImageRejected as rejected:  # the batch that needs it says so; here it only changes the key
        return rejected.reason
