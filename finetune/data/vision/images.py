"""STAND-IN (vcore) until vdata's images.py merges: the contract's names, the least behaviour (issue 39)."""


class ImageRejected(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail); self.reason, self.detail = reason, detail  # noqa: E702


def load_image(part: dict, *, max_pixels: int | None = None, min_pixels: int | None = None):
    from PIL import Image
    try:
        image = Image.open(part["path"]).convert("RGB")
    except OSError as exc:
        raise ImageRejected("unreadable_image", str(exc)) from None
    scale = max(min(1.0, (max_pixels or 1 << 62) / (image.width * image.height)), (min_pixels or 0) / (image.width * image.height)) ** 0.5
    return image if scale == 1 else image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))))


def image_parts(record: dict) -> list[dict]:
    return [p for m in record.get("messages", []) if isinstance(m.get("content"), list) for p in m["content"] if p.get("type") == "image"]
