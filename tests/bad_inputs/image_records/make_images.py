"""Writes the small images of tests/bad_inputs/image_records/images/ (run once; the files are committed)."""
import io, struct, zlib
from pathlib import Path
from PIL import Image

out = Path("tests/bad_inputs/image_records/images")
RED, BLUE = (255, 0, 0), (0, 0, 255)

def halves(size=(16, 8), left=RED, right=BLUE):
    im = Image.new("RGB", size, left)
    im.paste(right, (size[0] // 2, 0, size[0], size[1]))
    return im

halves().save(out / "rgb.png")
# CMYK JPEG: cyan left, yellow right
cmyk = Image.new("CMYK", (16, 8), (255, 0, 0, 0)); cmyk.paste((0, 0, 255, 0), (8, 0, 16, 8))
cmyk.save(out / "cmyk.jpg", quality=95)
# 16-bit grey PNG: 0 | 32768 | 65535 columns
g = Image.new("I;16", (3, 1)); g.putpixel((0, 0), 0); g.putpixel((1, 0), 32768); g.putpixel((2, 0), 65535)
g.save(out / "grey16.png")
# palette PNG with a transparent index
p = Image.new("P", (4, 2), 0); p.putpalette([255, 0, 0, 0, 255, 0, 0, 0, 0]); p.putpixel((1, 0), 1); p.putpixel((2, 0), 2)
p.save(out / "palette.png", transparency=2)
# LA (grey + alpha): grey 100 opaque, then fully transparent
la = Image.new("LA", (2, 1), (100, 255)); la.putpixel((1, 0), (0, 0)); la.save(out / "grey_alpha.png")
# RGBA: red opaque, then transparent black
rgba = Image.new("RGBA", (2, 1), (255, 0, 0, 255)); rgba.putpixel((1, 0), (0, 0, 0, 0)); rgba.save(out / "rgba.png")
# animated GIF: red frame then blue frame
Image.new("RGB", (4, 4), RED).save(out / "animated.gif", save_all=True, append_images=[Image.new("RGB", (4, 4), BLUE)], duration=100, loop=0)
# EXIF Orientation 6 (rotate 90 clockwise to display): stored 16x8 red|blue, shown 8x16 red on top
exif = Image.Exif(); exif[0x0112] = 6
halves().save(out / "exif_rotated.jpg", quality=95, exif=exif)
# truncated: a valid PNG cut inside its IDAT chunk
buf = io.BytesIO(); Image.new("RGB", (64, 64), RED).save(buf, "PNG", compress_level=0); data = buf.getvalue()
(out / "truncated.png").write_bytes(data[: len(data) // 2])
# not an image: text with an image's name
(out / "not_an_image.png").write_text("this is not a PNG\n")
(out / "empty.png").write_bytes(b"")
# a decompression bomb: a PNG header that claims 40,000 x 40,000 pixels (1.6 gigapixels) in 60 bytes
def chunk(kind, body):
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
ihdr = struct.pack(">IIBBBBB", 40000, 40000, 8, 2, 0, 0, 0)
(out / "bomb.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))
# truncated JPEG: its header is whole, its scan cut short (only decoding finds it)
buf = io.BytesIO(); halves((64, 64)).save(buf, "JPEG", quality=95); data = buf.getvalue()
scan = data.index(b"\xff\xda")  # start of scan: everything before it (the header) stays whole
(out / "truncated.jpg").write_bytes(data[: scan + (len(data) - scan) // 2])
