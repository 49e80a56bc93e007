"""A corpus of malformed and edge-case images through `load_image`.

Each case is built here from nothing; each must give the right image or a typed, readable
`ImageError` naming the file, within a second.
"""
import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from forensicslab.imageio import (ImageError, ImageNotFound, ImageTooLarge, ImageTruncated, ImageUnreadable,
                                  load_image)

RNG = np.random.default_rng(0)
PHOTO = (np.linspace(0, 255, 64 * 48 * 3).reshape(48, 64, 3) + RNG.integers(0, 20, (48, 64, 3))).clip(0, 255).astype(np.uint8)


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bomb(w, h) -> bytes:
    "A valid PNG header claiming w x h pixels, with almost no data."
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", zlib.compress(b"\0" * 64)) + _png_chunk(b"IEND", b"")


def jpeg_bytes(arr=PHOTO, **kw) -> bytes:
    b = io.BytesIO(); Image.fromarray(arr).save(b, "JPEG", quality=90, **kw); return b.getvalue()


def pil_bytes(im, fmt, **kw) -> bytes:
    b = io.BytesIO(); im.save(b, fmt, **kw); return b.getvalue()


def exif_rotated(orientation: int) -> bytes:
    im = Image.fromarray(PHOTO); ex = im.getexif(); ex[0x0112] = orientation
    return pil_bytes(im, "JPEG", exif=ex, quality=95)


def animated(fmt, **kw) -> bytes:
    frames = [Image.fromarray(np.full((20, 30, 3), v, np.uint8)) for v in (10, 200, 90)]
    return pil_bytes(frames[0], fmt, save_all=True, append_images=frames[1:], **kw)


def jpeg_sof_bomb() -> bytes:
    "A real JPEG whose SOF0 frame header is patched to claim 60000 x 60000 pixels."
    data = bytearray(jpeg_bytes())
    i = data.find(b"\xff\xc0")
    struct.pack_into(">HH", data, i + 5, 60000, 60000)
    return bytes(data)


def gif_bomb() -> bytes:
    "A real GIF whose screen and image descriptors are patched to claim 65000 x 65000 pixels."
    data = bytearray(pil_bytes(Image.fromarray(PHOTO).convert("P"), "GIF"))
    struct.pack_into("<HH", data, 6, 65000, 65000)
    i = data.find(b"\x2c", 13 + 3 * 256)
    struct.pack_into("<HH", data, i + 5, 65000, 65000)
    return bytes(data)


def tiff_float(nan=False) -> bytes:
    a = np.linspace(0, 1, 24 * 16, dtype=np.float32).reshape(16, 24)
    if nan: a[3, 3] = np.nan
    return pil_bytes(Image.fromarray(a, mode="F"), "TIFF")


def palette_with_transparency() -> bytes:
    im = Image.fromarray(PHOTO).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    return pil_bytes(im, "PNG", transparency=0)


def rgb16_png() -> bytes:
    import cv2
    ok, buf = cv2.imencode(".png", (PHOTO.astype(np.uint16) * 257)[..., ::-1])
    assert ok; return buf.tobytes()


def multipage_tiff() -> bytes:
    a, b = Image.fromarray(PHOTO), Image.fromarray(255 - PHOTO)
    return pil_bytes(a, "TIFF", save_all=True, append_images=[b])


# name -> (bytes, expected): expected is an ImageError subclass, or a check on the LoadedImage.
def ok(shape=None, **facts):
    def check(im):
        assert im.rgb.dtype == np.uint8 and im.rgb.ndim == 3 and im.rgb.shape[2] == 3
        if shape: assert im.rgb.shape[:2] == shape, im.rgb.shape
        for k, v in facts.items(): assert getattr(im, k) == v, (k, getattr(im, k), v)
    return check


jpg = jpeg_bytes()
png = pil_bytes(Image.fromarray(PHOTO), "PNG")
CORPUS = {
    "zero.png": (b"", ImageUnreadable),
    "text.png": (b"hello, I am a text file\n" * 10, ImageUnreadable),
    "html.jpg": (b"<html><body>404 not found</body></html>", ImageUnreadable),
    "random.jpg": (RNG.integers(0, 256, 4096, dtype=np.uint8).tobytes(), ImageUnreadable),
    "signature_only.png": (b"\x89PNG\r\n\x1a\n", (ImageUnreadable, ImageTruncated)),
    "truncated.jpg": (jpg[: len(jpg) // 2], ImageTruncated),
    "truncated_header.jpg": (jpg[:100], (ImageTruncated, ImageUnreadable)),
    "truncated.png": (png[: len(png) // 2], ImageTruncated),
    "garbled_idat.png": (png[:60] + bytes(200) + png[260:], ImageTruncated),
    "bomb_30000.png": (png_bomb(30000, 30000), ImageTooLarge),
    "bomb_sof.jpg": (jpeg_sof_bomb(), ImageTooLarge),
    "bomb.gif": (gif_bomb(), ImageTooLarge),
    "nan.tif": (tiff_float(nan=True), ImageUnreadable),
    "one.png": (pil_bytes(Image.new("RGB", (1, 1), (9, 8, 7)), "PNG"), ok((1, 1))),
    "photo.jpg": (jpg, ok((48, 64), format="JPEG")),
    "grey.jpg": (pil_bytes(Image.fromarray(PHOTO[..., 0]), "JPEG"), ok((48, 64))),
    "bilevel.png": (pil_bytes(Image.fromarray(PHOTO[..., 0] > 128), "PNG"), ok((48, 64))),
    "grey16.png": (pil_bytes(Image.fromarray((PHOTO[..., 0].astype(np.uint16) * 257)), "PNG"), ok((48, 64), bit_depth=16)),
    "rgb16.png": (rgb16_png(), ok((48, 64))),
    "cmyk.jpg": (pil_bytes(Image.fromarray(PHOTO).convert("CMYK"), "JPEG"), ok((48, 64))),
    "cmyk.tif": (pil_bytes(Image.fromarray(PHOTO).convert("CMYK"), "TIFF"), ok((48, 64))),
    "palette.gif": (pil_bytes(Image.fromarray(PHOTO).convert("P"), "GIF"), ok((48, 64))),
    "palette_transparency.png": (palette_with_transparency(), ok((48, 64), had_alpha=True)),
    "rgba.png": (pil_bytes(Image.fromarray(np.dstack([PHOTO, np.full((48, 64), 128, np.uint8)])), "PNG"), ok((48, 64), had_alpha=True)),
    "la.png": (pil_bytes(Image.fromarray(np.dstack([PHOTO[..., 0], PHOTO[..., 1]]), mode="LA"), "PNG"), ok((48, 64), had_alpha=True)),
    "animated.gif": (animated("GIF", duration=50, loop=0), ok((20, 30), n_frames=3)),
    "animated.png": (animated("PNG", duration=50), ok((20, 30), n_frames=3)),
    "animated.webp": (animated("WEBP", duration=50), ok((20, 30), n_frames=3)),
    "multipage.tif": (multipage_tiff(), ok((48, 64), n_frames=2)),
    "float.tif": (tiff_float(), ok((16, 24), bit_depth=32)),
    "rot3.jpg": (exif_rotated(3), ok((48, 64), exif_transposed=True)),
    "rot6.jpg": (exif_rotated(6), ok((64, 48), exif_transposed=True)),
    "rot8.jpg": (exif_rotated(8), ok((64, 48), exif_transposed=True)),
    "photo.webp": (pil_bytes(Image.fromarray(PHOTO), "WEBP"), ok((48, 64))),
    "photo.bmp": (pil_bytes(Image.fromarray(PHOTO), "BMP"), ok((48, 64))),
    "photo.ppm": (pil_bytes(Image.fromarray(PHOTO), "PPM"), ok((48, 64))),
    "photo.tif": (pil_bytes(Image.fromarray(PHOTO), "TIFF"), ok((48, 64))),
    "wrong_extension.png": (jpg, ok((48, 64), format="JPEG")),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    for name, (data, _) in CORPUS.items():
        (d / name).write_bytes(data)
    return d


def test_corpus_covers_every_refusal_and_format(corpus):
    "Loads the whole corpus: each typed refusal is raised by some file, each common format is decoded by some file."
    raised, formats = set(), set()
    for name in CORPUS:
        try: formats.add(load_image(corpus / name).format)
        except ImageError as e: raised.add(type(e))
    assert {ImageUnreadable, ImageTruncated, ImageTooLarge} <= raised, raised
    assert {"JPEG", "PNG", "GIF", "WEBP", "TIFF", "BMP", "PPM"} <= formats, formats


def test_image_errors_are_forensicslab_errors():
    from forensicslab.core import ForensicsLabError
    assert issubclass(ImageError, ForensicsLabError) and issubclass(ImageError, ValueError)


def test_symlink_loop_is_named(tmp_path):
    "Issue 17 item 14: a symlink loop is not 'no such file'."
    (tmp_path / "a.jpg").symlink_to(tmp_path / "b.jpg")
    (tmp_path / "b.jpg").symlink_to(tmp_path / "a.jpg")
    with pytest.raises(ImageNotFound, match="symbolic link loop"):
        load_image(tmp_path / "a.jpg")
    (tmp_path / "dangling.jpg").symlink_to(tmp_path / "gone.jpg")
    with pytest.raises(ImageNotFound, match="dangling symbolic link"):
        load_image(tmp_path / "dangling.jpg")


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_case(corpus, name):
    path = corpus / name
    expected = CORPUS[name][1]
    if isinstance(expected, type) or isinstance(expected, tuple):
        with pytest.raises(ImageError) as e:
            load_image(path)
        assert isinstance(e.value, expected), f"{name}: got {type(e.value).__name__}: {e.value}"
        assert str(path) in str(e.value) and e.value.reason
    else:
        expected(load_image(path))


def test_missing_and_directory(tmp_path):
    with pytest.raises(ImageNotFound, match="no such file"):
        load_image(tmp_path / "nope.jpg")
    with pytest.raises(ImageNotFound, match="not a regular file"):
        load_image(tmp_path)


def test_exif_rotation_gives_upright_pixels(corpus):
    upright = load_image(corpus / "photo.jpg").rgb.astype(int)
    rotated = load_image(corpus / "rot6.jpg").rgb.astype(int)   # orientation 6: viewer rotates 90 degrees clockwise
    assert np.abs(np.rot90(upright, k=-1) - rotated).mean() < 6


def test_large_photo_within_cap_loads(tmp_path):
    p = tmp_path / "big.jpg"
    Image.new("RGB", (6000, 4000), (120, 130, 140)).save(p, quality=80)
    im = load_image(p)
    assert im.size == (6000, 4000)
    with pytest.raises(ImageTooLarge, match="exceeds the cap"):
        load_image(p, max_pixels=10_000_000)


def test_hash_depends_on_pixels_only(corpus):
    a = load_image(corpus / "photo.bmp")
    b = load_image(corpus / "photo.ppm")
    c = load_image(corpus / "photo.tif")
    assert a.hash == b.hash == c.hash
    assert a.hash != load_image(corpus / "photo.jpg").hash


def test_concurrent_loads_with_different_caps_leave_pillow_alone(tmp_path, monkeypatch):
    """Issue 25 item 4: 8 threads load images of different sizes under different caps while a watcher samples
    Pillow's process-wide guard. Every load gets its own answer, and the guard is never changed, not even for a
    moment (the old loader set it to None around each open, so the watcher saw None and an unlucky interleaving
    left it off for good)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor
    sizes = [(64, 48), (300, 200), (640, 480), (120, 90)]
    paths = []
    for w, h in sizes:
        paths.append(tmp_path / f"{w}x{h}.png")
        Image.fromarray(RNG.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(paths[-1])
    guard, seen, stop = Image.MAX_IMAGE_PIXELS, set(), threading.Event()

    def watch():
        while not stop.is_set(): seen.add(Image.MAX_IMAGE_PIXELS)

    def one(i):
        (w, h), cap = sizes[i % 4], (20_000, 100_000, 1_000_000)[i % 3]
        try: got = load_image(paths[i % 4], max_pixels=cap).size
        except ImageTooLarge: got = "refused"
        return got == ((w, h) if w * h <= cap else "refused")

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(8) as ex: ok = list(ex.map(one, range(400)))
    finally:
        stop.set(); watcher.join()
    assert all(ok), f"{ok.count(False)} of {len(ok)} loads got another thread's answer"
    assert seen == {guard} and Image.MAX_IMAGE_PIXELS == guard, seen
    # the application's own guard is respected, not bypassed: lowered to 1000 px, a 120x90 image is refused
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(ImageTooLarge, match="MAX_IMAGE_PIXELS"):
        load_image(paths[3])
