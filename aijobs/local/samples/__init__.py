"""Small sample documents and images for the demo, the tests and the bench, shipped with the package
(made once, committed, never generated at run time):

- `invoice.pdf`: a two-page invoice with a text layer (its number, dates, lines, totals, bank details);
- `scanned-form.png`: a scanned insurance claim form, 850 x 1100 pixels (no text layer: an image);
- `product-photo.jpg`: a product photo (a mug), 480 x 360 pixels;
- `panorama.png`: a landscape 9,000 x 300 pixels, wider than any provider takes an image (8,000).
"""

from __future__ import annotations

from importlib.resources import files

INVOICE = "invoice.pdf"
SCANNED_FORM = "scanned-form.png"
PRODUCT_PHOTO = "product-photo.jpg"
PANORAMA = "panorama.png"
SAMPLES = (INVOICE, SCANNED_FORM, PRODUCT_PHOTO, PANORAMA)


def sample(name: str) -> bytes:
    """The bytes of one of SAMPLES."""
    if name not in SAMPLES:
        raise ValueError(f"no sample {name!r}: the samples are {', '.join(SAMPLES)}")
    return files(__name__).joinpath(name).read_bytes()
