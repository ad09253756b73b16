"""digits5-offline: a Digit-5-style benchmark (5 domains x 10 digits) built without any download.

Everything comes from files the installed packages ship: scikit-learn's 8x8 handwritten
digits, the TrueType fonts bundled with matplotlib and scikit-image's sample photos. The
five domains imitate the Digit-5 members -- handwritten (in MNIST's role), mnist-m, svhn,
synthdigits and usps -- closely enough to give a real domain shift, but they are
stand-ins built from other material, not those datasets.

Generation is deterministic for ``DatasetOptions.seed``: every random draw comes from a
numpy ``default_rng`` seeded with ``(seed, domain, split)``, and pixel maths avoids
anything whose result could depend on the CPU (array sin/cos, BLAS, threads). It takes
a few seconds, so nothing is cached on disk; the arrays are memoised per process.

Class names are the English words ("zero" ... "nine"): they read naturally in text
prompts ("a photo of the digit three") and cannot be mistaken for label indices.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import math
import zlib
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image, ImageChops, ImageDraw, ImageFilter, ImageFont, ImageOps

from fedcache.borrowed import random_kept
from fedcache.errors import ConfigError, DataNotFoundError
from fedcache.extract.datasets.base import DATASETS, ArraySource, Dataset, DatasetOptions, DatasetSpec, Samples

log = logging.getLogger(__name__)

NAME = "digits5-offline"
CLASSES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# Spelled and ordered like the real "digit5" dataset so domain options carry over; the
# handwritten domain sits in MNIST's slot but keeps its own name, since it is not MNIST.
DOMAINS = ("handwritten", "mnist-m", "svhn", "synthdigits", "usps")
TEST_PER_CLASS = 100
TRAIN_PER_CLASS = 150  # the handwritten domain has only what scikit-learn ships left over
SIZE = 32
# Glyphs are warped on a canvas twice the output size and box-reduced, for anti-aliasing.
_HI = 2 * SIZE
_GLYPH_PX = 96
_PAD = 3
# A 3x3 mesh is enough for a smooth wobble and keeps PIL's per-quad overhead low.
_MESH_TICKS = (0, 21, 43, 64)
_MESH_GRID = np.stack(np.meshgrid(_MESH_TICKS, _MESH_TICKS), axis=-1).astype(np.float64)  # [row, col] -> (x, y)

# Fonts matplotlib ships that have ordinary lining digits at the ASCII code points
# (the STIX size/non-unicode variants, cmex/cmsy/cmmi and LastResort do not).
_FONT_FILES = (
    "DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSans-BoldOblique.ttf",
    "DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf", "DejaVuSansMono-Oblique.ttf",
    "DejaVuSansMono-BoldOblique.ttf", "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf",
    "DejaVuSerif-Italic.ttf", "DejaVuSerif-BoldItalic.ttf", "STIXGeneral.ttf", "STIXGeneralBol.ttf",
    "STIXGeneralItalic.ttf", "STIXGeneralBolIta.ttf", "cmr10.ttf", "cmb10.ttf", "cmss10.ttf",
    "cmti10.ttf", "cmtt10.ttf",
)
# House numbers are upright and mostly sans or bold.
_SIGN_FONTS = (
    "DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf", "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf", "STIXGeneral.ttf",
    "STIXGeneralBol.ttf", "cmss10.ttf", "cmb10.ttf", "cmr10.ttf",
)
# scikit-image sample images that are part of its wheel (others need pooch and a network).
_PHOTOS = (
    "astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry",
    "retina", "colorwheel",
)
_TEXTURES = ("brick", "grass", "gravel", "moon")


def _rng(seed: int, domain: str, split: str) -> np.random.Generator:
    # crc32, unlike hash(), is the same in every process.
    return np.random.default_rng([seed, zlib.crc32(f"{domain}/{split}".encode())])


@functools.lru_cache(maxsize=1)
def _glyph_bank() -> dict[str, tuple[Image.Image, ...]]:
    """Per font file, the ten digits as tight 'L' crops (ink 255 on 0) with a small margin."""
    import matplotlib

    font_dir = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    bank = {}
    for name in _FONT_FILES:
        path = font_dir / name
        if path.is_file():
            font = ImageFont.truetype(str(path), _GLYPH_PX)
            bank[name] = tuple(_render_glyph(font, str(d)) for d in range(10))
        else:
            log.warning("font %s not found in %s; %s will use fewer fonts", name, font_dir, NAME)
    if not bank:
        raise DataNotFoundError(
            f"{NAME} renders digits with matplotlib's bundled fonts, but none of {list(_FONT_FILES)} "
            f"is in {font_dir}: reinstall matplotlib (pip install --force-reinstall matplotlib)"
        )
    return bank


def _render_glyph(font: ImageFont.FreeTypeFont, text: str) -> Image.Image:
    side = 2 * _GLYPH_PX
    canvas = Image.new("L", (side, side), 0)
    ImageDraw.Draw(canvas).text((side // 2, side // 2), text, font=font, fill=255, anchor="mm")
    return ImageOps.expand(canvas.crop(canvas.getbbox()), border=_PAD, fill=0)


def _place(
    glyph: Image.Image,
    height: float,
    centre: tuple[float, float],
    angle: float = 0.0,
    shear: float = 0.0,
    stretch: float = 1.0,
    wobble: float = 0.0,
    rng: np.random.Generator | None = None,
) -> Image.Image:
    """Draw ``glyph`` on a blank _HI x _HI canvas: ink ``height`` px tall, centred on ``centre``.

    ``angle`` (degrees), ``shear`` and ``stretch`` (x scale) make an affine map; ``wobble``
    (px) jitters the vertices of a coarse mesh on top of it, a cheap elastic distortion
    that makes font glyphs look hand-drawn.
    """
    scale = height / (glyph.height - 2 * _PAD)
    # Scalar math.cos/sin: numpy's vectorised ones may differ in the last bit between CPUs.
    cos, sin = math.cos(math.radians(angle)), math.sin(math.radians(angle))
    # Forward map A = scale * R(angle) @ [[1, shear], [0, 1]] @ diag(stretch, 1); PIL wants A^-1.
    a, b = scale * cos * stretch, scale * (cos * shear - sin)
    c, d = scale * sin * stretch, scale * (sin * shear + cos)
    det = a * d - b * c
    inv = np.array([[d, -b], [-c, a]]) / det
    # Spelled out rather than `inv @ centre`: BLAS kernels may round differently per CPU.
    offset = np.array([
        glyph.width / 2 - (inv[0, 0] * centre[0] + inv[0, 1] * centre[1]),
        glyph.height / 2 - (inv[1, 0] * centre[0] + inv[1, 1] * centre[1]),
    ])
    if wobble <= 0 or rng is None:
        coeffs = (inv[0, 0], inv[0, 1], offset[0], inv[1, 0], inv[1, 1], offset[1])
        return glyph.transform((_HI, _HI), Image.Transform.AFFINE, coeffs, Image.Resampling.BILINEAR, fillcolor=0)
    grid = _MESH_GRID + rng.normal(0.0, wobble, size=_MESH_GRID.shape)
    src = (grid[..., 0:1] * inv[:, 0] + grid[..., 1:2] * inv[:, 1] + offset).tolist()
    mesh = []
    for i in range(len(_MESH_TICKS) - 1):
        for j in range(len(_MESH_TICKS) - 1):
            box = (_MESH_TICKS[j], _MESH_TICKS[i], _MESH_TICKS[j + 1], _MESH_TICKS[i + 1])
            quad = (*src[i][j], *src[i + 1][j], *src[i + 1][j + 1], *src[i][j + 1])
            mesh.append((box, quad))
    return glyph.transform((_HI, _HI), Image.Transform.MESH, mesh, Image.Resampling.BILINEAR, fillcolor=0)


def _thicken(canvas: Image.Image, radius: int) -> np.ndarray:
    """Grey dilation by a (2r+1)^2 square, as uint8 (numpy shifts: PIL's MaxFilter is slow)."""
    a = np.asarray(canvas)
    for axis in (0, 1):
        out = a.copy()
        for k in range(1, radius + 1):
            lo = [slice(None)] * 2
            hi = [slice(None)] * 2
            lo[axis], hi[axis] = slice(0, -k), slice(k, None)
            np.maximum(out[tuple(lo)], a[tuple(hi)], out=out[tuple(lo)])
            np.maximum(out[tuple(hi)], a[tuple(lo)], out=out[tuple(hi)])
        a = out
    return a


def _to_mask(canvas: Image.Image | np.ndarray) -> np.ndarray:
    """A _HI canvas as a SIZE x SIZE float mask in [0, 1]."""
    if isinstance(canvas, np.ndarray):
        canvas = Image.fromarray(canvas)
    return np.asarray(canvas.reduce(_HI // SIZE), dtype=np.float32) / 255.0


def _balanced_labels(rng: np.random.Generator, per_class: int) -> np.ndarray:
    return rng.permutation(np.repeat(np.arange(len(CLASSES)), per_class))


def _luma(rgb: np.ndarray) -> np.ndarray:
    return 0.299 * rgb[..., 0] + 0.587 * rgb[..., 1] + 0.114 * rgb[..., 2]


def _contrasting_colours(rng: np.random.Generator, n: int, min_diff: float) -> tuple[np.ndarray, np.ndarray]:
    """Background and ink colours (n, 3) whose luminances differ by at least ``min_diff``."""
    bg = rng.integers(0, 256, size=(n, 3)).astype(np.float32)
    fg = rng.integers(0, 256, size=(n, 3)).astype(np.float32)
    bad = np.abs(_luma(bg) - _luma(fg)) < min_diff
    while bad.any():
        fg[bad] = rng.integers(0, 256, size=(int(bad.sum()), 3))
        bad = np.abs(_luma(bg) - _luma(fg)) < min_diff
    return bg, fg


def _blend(bg: np.ndarray, fg: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Ink ``fg`` over ``bg`` with coverage ``mask`` (N, H, W), rounded to uint8."""
    m = mask[..., None]
    return _to_uint8(bg * (1.0 - m) + fg * m)


def _to_uint8(x: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def _patch(rng: np.random.Generator, image: Image.Image, lo: int, hi: int) -> np.ndarray:
    """A random square patch of side in [lo, hi], resized to SIZE x SIZE, mirrored half the time."""
    side = int(rng.integers(lo, min(hi, *image.size) + 1))
    x = int(rng.integers(0, image.width - side + 1))
    y = int(rng.integers(0, image.height - side + 1))
    patch = image.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=(x, y, x + side, y + side))
    return np.asarray(ImageOps.mirror(patch) if rng.random() < 0.5 else patch)


@functools.lru_cache(maxsize=2)
def _skimage_images(names: tuple[str, ...]) -> tuple[Image.Image, ...]:
    try:
        import skimage.data
    except ImportError as exc:
        raise DataNotFoundError(
            f"{NAME} builds its photo backgrounds from scikit-image's sample images: "
            "pip install 'fedcache[offline]' (or scikit-image)"
        ) from exc
    return tuple(Image.fromarray(np.ascontiguousarray(getattr(skimage.data, n)())) for n in names)


# --- the five domains -----------------------------------------------------------------


def _handwritten(seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """scikit-learn's 8x8 digits, smoothly upscaled into the middle of a black frame like MNIST."""
    grey, labels = _sklearn_digits()
    images = np.stack([_upscale_8x8(g) for g in _to_uint8(grey * (255.0 / 16.0))])
    rng = _rng(seed, "handwritten", "split")
    test = np.sort(np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:TEST_PER_CLASS] for c in range(10)]))
    train = np.setdiff1d(np.arange(len(labels)), test)
    return {"train": (images[train], labels[train]), "test": (images[test], labels[test])}


def _sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    """(1797, 8, 8) grey levels 0..16 and labels, from the CSV scikit-learn ships.

    Reading the file directly skips importing scikit-learn and SciPy, which takes 1-2 s,
    over half the time of generating everything else; ``load_digits`` is the fallback.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise DataNotFoundError(f"{NAME} needs scikit-learn for its handwritten digits: pip install scikit-learn")
    csv = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    if csv.is_file():
        data = np.loadtxt(csv, delimiter=",", dtype=np.float64)
        return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)
    with random_kept():
        from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.images, digits.target.astype(np.int64)


def _upscale_8x8(grey: np.ndarray) -> np.ndarray:
    inner = Image.fromarray(grey).resize((24, 24), Image.Resampling.BICUBIC)
    framed = ImageOps.expand(inner, border=(SIZE - 24) // 2, fill=0)
    return np.asarray(framed.convert("RGB"))


def _synth(rng: np.random.Generator, labels: np.ndarray) -> np.ndarray:
    """SynthDigits-like: one crisp font digit, flat random colours, some rotation."""
    bank = _glyph_bank()
    fonts = list(bank)
    masks = np.empty((len(labels), SIZE, SIZE), np.float32)
    for i, y in enumerate(labels):
        glyph = bank[fonts[rng.integers(len(fonts))]][y]
        centre = (_HI / 2 + rng.uniform(-5, 5), _HI / 2 + rng.uniform(-4, 4))
        canvas = _place(glyph, rng.uniform(30, 46), centre, angle=rng.uniform(-15, 15),
                        shear=rng.uniform(-0.15, 0.15), stretch=rng.uniform(0.85, 1.25))
        masks[i] = _to_mask(canvas)
    bg, fg = _contrasting_colours(rng, len(labels), 90.0)
    return _blend(bg[:, None, None], fg[:, None, None], masks)


def _mnist_m(rng: np.random.Generator, labels: np.ndarray) -> np.ndarray:
    """MNIST-M-like: a wobbly thick digit cut out of a photo patch by |photo - digit|."""
    bank = _glyph_bank()
    fonts = list(bank)
    photos = _skimage_images(_PHOTOS)
    masks = np.empty((len(labels), SIZE, SIZE), np.float32)
    patches = np.empty((len(labels), SIZE, SIZE, 3), np.uint8)
    for i, y in enumerate(labels):
        glyph = bank[fonts[rng.integers(len(fonts))]][y]
        centre = (_HI / 2 + rng.uniform(-3, 3), _HI / 2 + rng.uniform(-3, 3))
        canvas = _place(glyph, rng.uniform(34, 42), centre, angle=rng.uniform(-12, 12),
                        shear=rng.uniform(-0.25, 0.25), stretch=rng.uniform(0.8, 1.15),
                        wobble=2.0, rng=rng)
        masks[i] = _to_mask(_thicken(canvas, int(rng.integers(0, 3))))
        patches[i] = _patch(rng, photos[rng.integers(len(photos))], SIZE, 3 * SIZE)
    # MNIST-M's blend: the ink inverts the photo's colours, so the digit has no colour of its own.
    return _to_uint8(np.abs(patches.astype(np.float32) - masks[..., None] * 255.0))


def _usps(rng: np.random.Generator, labels: np.ndarray) -> np.ndarray:
    """USPS-like: thick, slanted, frame-filling grey strokes at 16x16, blurred and upsampled."""
    bank = _glyph_bank()
    fonts = list(bank)
    low = SIZE // 2
    ink = np.empty((len(labels), SIZE, SIZE), np.uint8)
    for i, y in enumerate(labels):
        glyph = bank[fonts[rng.integers(len(fonts))]][y]
        canvas = _place(glyph, rng.uniform(52, 60), (_HI / 2 + rng.uniform(-1.5, 1.5), _HI / 2),
                        angle=rng.uniform(-8, 8), shear=rng.uniform(-0.35, 0.1),
                        stretch=rng.uniform(1.0, 1.4), wobble=3.0, rng=rng)
        canvas = Image.fromarray(_thicken(canvas, int(rng.integers(1, 3))))
        small = canvas.reduce(_HI // low).filter(ImageFilter.GaussianBlur(0.6))
        ink[i] = np.asarray(small.resize((SIZE, SIZE), Image.Resampling.BILINEAR))
    grey = _to_uint8(ink * rng.uniform(0.75, 1.0, size=(len(labels), 1, 1)))
    return np.repeat(grey[..., None], 3, axis=-1)


def _svhn(rng: np.random.Generator, labels: np.ndarray) -> np.ndarray:
    """SVHN-like: a house number cropped around one digit, neighbours cut off, blur and noise."""
    bank = _glyph_bank()
    fonts = [f for f in _SIGN_FONTS if f in bank] or list(bank)
    textures = _skimage_images(_TEXTURES)
    n = len(labels)
    masks = np.empty((n, SIZE, SIZE), np.float32)
    grain = np.empty((n, SIZE, SIZE), np.uint8)
    for i, y in enumerate(labels):
        glyphs = bank[fonts[rng.integers(len(fonts))]]
        masks[i] = _to_mask(_house_number(rng, glyphs, int(y)))
        grain[i] = _patch(rng, textures[rng.integers(len(textures))], 48, 160)
    bg, fg = _contrasting_colours(rng, n, 55.0)
    sharp = _blend(_walls(rng, grain, bg), fg[:, None, None], masks)
    radii = rng.uniform(0.3, 1.3, size=n).tolist()
    blurred = np.stack([_blur(im, r) for im, r in zip(sharp, radii)])
    noise = rng.standard_normal(size=sharp.shape, dtype=np.float32) * rng.uniform(2.0, 9.0, size=(n, 1, 1, 1))
    return _to_uint8(blurred + noise)


def _house_number(rng: np.random.Generator, glyphs: tuple[Image.Image, ...], digit: int) -> Image.Image:
    """The labelled digit centred, with neighbours of the same style left and/or right."""
    height = rng.uniform(34, 52)
    stretch = rng.uniform(0.85, 1.3)
    angle = rng.uniform(-8, 8)
    cx, cy = _HI / 2 + rng.uniform(-3, 3), _HI / 2 + rng.uniform(-3, 3)

    def width(g: Image.Image) -> float:
        return (g.width - 2 * _PAD) * height / (g.height - 2 * _PAD) * stretch

    canvas = _place(glyphs[digit], height, (cx, cy), angle=angle, stretch=stretch)
    for side in (-1, 1):
        if rng.random() < 0.7:
            other = glyphs[rng.integers(10)]
            gap = rng.uniform(2, 8)
            ox = cx + side * (width(glyphs[digit]) / 2 + gap + width(other) / 2)
            canvas = ImageChops.lighter(canvas, _place(other, height, (ox, cy), angle=angle, stretch=stretch))
    return canvas


def _blur(image: np.ndarray, radius: float) -> np.ndarray:
    return np.asarray(Image.fromarray(image).filter(ImageFilter.GaussianBlur(radius)))


def _walls(rng: np.random.Generator, grain: np.ndarray, colours: np.ndarray) -> np.ndarray:
    """Flat ``colours`` (n, 3) with a faint grey ``grain`` and a lighting gradient, (n, SIZE, SIZE, 3)."""
    n = len(grain)
    tex = grain.astype(np.float32)
    lo, hi = tex.min(axis=(1, 2), keepdims=True), tex.max(axis=(1, 2), keepdims=True)
    tex = (tex - lo) / (hi - lo + 1.0) - 0.5
    ramp = np.arange(SIZE, dtype=np.float32) / (SIZE - 1) - 0.5
    slope = rng.uniform(-1, 1, size=(n, 2, 1, 1))
    light = slope[:, 0] * ramp[None, None, :] + slope[:, 1] * ramp[None, :, None]
    shade = tex * rng.uniform(10, 40, size=(n, 1, 1)) + light * rng.uniform(0, 50, size=(n, 1, 1))
    return colours[:, None, None, :] + shade[..., None]


_GENERATORS: dict[str, Callable[[np.random.Generator, np.ndarray], np.ndarray]] = {
    "mnist-m": _mnist_m,
    "svhn": _svhn,
    "synthdigits": _synth,
    "usps": _usps,
}


@functools.lru_cache(maxsize=2)
def build(seed: int = 0) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """All (split, domain) -> (uint8 images (N, 32, 32, 3), int64 labels), read-only."""
    if seed < 0:
        raise ConfigError(f"{NAME} needs a non-negative seed, got {seed}")
    log.info("generating %s for seed %d (a few seconds, kept in memory)", NAME, seed)
    parts = {(split, "handwritten"): arrays for split, arrays in _handwritten(seed).items()}
    for domain, generate in _GENERATORS.items():
        for split, per_class in (("train", TRAIN_PER_CLASS), ("test", TEST_PER_CLASS)):
            rng = _rng(seed, domain, split)
            labels = _balanced_labels(rng, per_class)
            parts[(split, domain)] = (generate(rng, labels), labels)
    for images, labels in parts.values():
        images.flags.writeable = False
        labels.flags.writeable = False
    return parts


# Backbones run these 32x32 images at 64x64, as FedPCL did for its digit ResNets: they
# hold 32 px of detail, and 224 would cost ~12x the compute to upsample blur.
IMAGE_SIZE = 64


def _load(options: DatasetOptions) -> Dataset:
    splits = {
        key: Samples(ArraySource(images, f"{NAME}/{key[1]}/{key[0]}"), labels)
        for key, (images, labels) in build(int(options.seed)).items()
    }
    return Dataset(name=NAME, classes=CLASSES, domains=DOMAINS, splits=splits, default_image_size=IMAGE_SIZE)


DATASETS.add(
    NAME,
    DatasetSpec(
        name=NAME,
        description=(
            "Digit-5-style benchmark generated offline: 10 digits x 5 look-alike domains (handwritten, "
            "mnist-m, svhn, synthdigits, usps), 32x32 RGB, 100 test images per class per domain"
        ),
        source="embedded",
        load=_load,
        classes=CLASSES,
        domains=DOMAINS,
        default_image_size=IMAGE_SIZE,
        reads=frozenset({"seed"}),  # built here: no folder to read, nothing to download
        how_to_get="built in: generated from scikit-learn's digits, matplotlib's fonts and "
        "scikit-image's sample photos; nothing to download",
    ),
)
