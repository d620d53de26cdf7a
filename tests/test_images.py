"""Images decoded for the processor (finetune/data/vision/images.py) and checked at read time
(finetune/ingest/images.py), on the corpus of tests/bad_inputs/image_records/images/: each image either loads
with the right pixels and orientation, or is one ImageRejected with its counted-reject reason."""

from __future__ import annotations

import base64
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image

from finetune.data.vision.images import ImageRejected, budget_size, load_image
from finetune.ingest.images import MAX_IMAGE_PIXELS, check_image

CORPUS = Path(__file__).parent / "bad_inputs" / "image_records" / "images"
RED, BLUE, WHITE = (255, 0, 0), (0, 0, 255), (255, 255, 255)


def part(name: str) -> dict:
    return {"type": "image", "path": str(CORPUS / name)}


def close(pixel, expected, tolerance=3) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(pixel, expected))


def pixels(image) -> list:
    return [image.getpixel((x, y)) for y in range(image.height) for x in range(image.width)]


@pytest.mark.parametrize("name, size, expected", [
    ("rgb.png", (16, 8), {(0, 0): RED, (15, 7): BLUE}),
    # CMYK JPEG: cyan | yellow
    ("cmyk.jpg", (16, 8), {(0, 0): (0, 255, 255), (15, 7): (255, 255, 0)}),
    # 16-bit grey 0 | 32768 | 65535: scaled into 8 bits (a plain convert clips every value over 255 to white)
    ("grey16.png", (3, 1), {(0, 0): (0, 0, 0), (1, 0): (128, 128, 128), (2, 0): WHITE}),
    # palette red, green, then the transparent index: onto white
    ("palette.png", (4, 2), {(0, 0): RED, (1, 0): (0, 255, 0), (2, 0): WHITE}),
    ("grey_alpha.png", (2, 1), {(0, 0): (100, 100, 100), (1, 0): WHITE}),
    ("rgba.png", (2, 1), {(0, 0): RED, (1, 0): WHITE}),  # transparent black composited onto white, not black
    ("animated.gif", (4, 4), {(0, 0): RED, (3, 3): RED}),  # the first frame (red), not the second (blue)
    # stored 16 x 8 red | blue with EXIF Orientation 6: shown 8 x 16, red on top, blue below
    ("exif_rotated.jpg", (8, 16), {(4, 2): RED, (4, 13): BLUE}),
])
def test_an_image_loads_as_rgb_the_way_it_is_meant_to_look(name, size, expected):
    image = load_image(part(name))
    assert image.mode == "RGB" and image.size == size
    for xy, colour in expected.items():
        assert close(image.getpixel(xy), colour, tolerance=3), (name, xy, image.getpixel(xy))
    check_image(part(name))  # the read-time check passes every one of them


@pytest.mark.parametrize("name, reason, at_read", [
    ("missing.png", "missing_image", True),
    ("empty.png", "empty_image", True),
    ("not_an_image.png", "unreadable_image", True),
    ("truncated.png", "unreadable_image", True),  # a PNG's chunk CRCs fail: found without decoding
    ("truncated.jpg", "unreadable_image", False),  # a JPEG's scan cut short: only decoding finds it
    ("bomb.png", "image_too_large", True),  # 60 bytes claiming 40,000 x 40,000 pixels
])
def test_a_bad_image_is_one_rejection_with_its_reason(name, reason, at_read):
    with pytest.raises(ImageRejected) as rejected:
        load_image(part(name))
    assert rejected.value.reason == reason and name in rejected.value.detail
    if at_read:
        with pytest.raises(ImageRejected, match=reason):
            check_image(part(name))
    else:
        assert check_image(part(name)) == (64, 64)


def png_header(width: int, height: int) -> bytes:
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + \
        chunk(b"IEND", b"")


def test_over_the_pixel_limit_but_under_pils_own_refusal_is_rejected_too():
    """PIL only warns between 1x and 2x its limit; here that is a reject, not a 100 MP image decoded."""
    assert 10_000 * 10_000 > MAX_IMAGE_PIXELS > 9_000 * 9_000
    data = base64.b64encode(png_header(10_000, 10_000)).decode()
    with pytest.raises(ImageRejected, match="image_too_large: a base64 image .* is 10,000 x 10,000 pixels, over"):
        check_image({"type": "image", "base64": data})


def test_base64_and_its_problems():
    image = Image.new("RGB", (3, 2), BLUE)
    import io

    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    loaded = load_image({"type": "image", "base64": base64.b64encode(buffer.getvalue()).decode()})
    assert loaded.size == (3, 2) and set(pixels(loaded)) == {BLUE}
    for data, reason in (("not base64!", "unreadable_image"), ("", "empty_image")):
        with pytest.raises(ImageRejected) as rejected:
            load_image({"type": "image", "base64": data})
        assert rejected.value.reason == reason
    with pytest.raises(ImageRejected) as rejected:
        load_image({"type": "image", "path": "https://example.com/cat.png"})
    assert rejected.value.reason == "image_url_offline" and "local files only" in rejected.value.detail


def test_a_50_megapixel_photo_is_shrunk_to_the_budget_keeping_its_aspect(tmp_path):
    """Made here (a 0.8 MB JPEG), not committed. Decoded at 1/8 scale first (PIL's draft), then resized."""
    photo = Image.new("RGB", (10_000, 5_000), RED)
    photo.paste(BLUE, (5_000, 0, 10_000, 5_000))
    photo.save(tmp_path / "huge.jpg", quality=90)
    del photo
    budget = 768 * 768
    image = load_image({"type": "image", "path": str(tmp_path / "huge.jpg")}, max_pixels=budget)
    width, height = image.size
    assert width * height <= budget and width * height > 0.99 * budget
    assert abs(width / height - 2.0) < 0.01
    assert close(image.getpixel((width // 4, height // 2)), RED) and close(image.getpixel((3 * width // 4, 0)), BLUE)


def test_a_tiny_image_is_grown_to_min_pixels():
    image = load_image(part("rgb.png"), min_pixels=32 * 32)
    assert image.size[0] * image.size[1] >= 32 * 32 and image.size[0] == 2 * image.size[1]
    assert close(image.getpixel((0, 0)), RED) and close(image.getpixel((image.width - 1, 0)), BLUE)


@pytest.mark.parametrize("size, budget", [((10_000, 5_000), 589_824), ((100_000, 1), 1_000), ((1, 100_000), 7),
                                          ((3, 7), 20), ((640, 480), 640 * 480)])
def test_budget_size_never_exceeds_the_budget(size, budget):
    width, height = budget_size(*size, budget, None)
    assert 1 <= width * height <= max(budget, 1) and width >= 1 and height >= 1
    if size[0] * size[1] <= budget:
        assert (width, height) == size
