"""Whether an image's file is whole: its structure walked to its end marker, no pixel decoded.

Pillow reads an image's header and stops; a file cut after its header would pass, and a provider
refuses it only once the request is paid for. So each format's blocks are walked by their lengths:
a PNG's chunks to IEND (Pillow's own `verify`, which checks each chunk's CRC), a JPEG's segments and
its scans' entropy-coded data to EOI, a GIF's blocks and sub-blocks to its trailer. A WebP file is
checked whole by libwebp when Pillow opens it.
"""

from __future__ import annotations

import struct
from typing import Any

from engine.core.attachments import MediaType

# A PNG's last chunk, whole: its length (0), type and CRC (the same in every PNG), within this much of
# the file's end (as some writers leave bytes after it).
_PNG_IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"
PNG_IEND_WITHIN = 4096
_JPEG_SOI, _JPEG_EOI, _JPEG_SOS = b"\xff\xd8", 0xD9, 0xDA
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM and the restart markers: no length
_GIF_TRAILER, _GIF_EXTENSION, _GIF_IMAGE = 0x3B, 0x21, 0x2C
_GIF_SCREEN_BYTES, _GIF_DESCRIPTOR_BYTES = 13, 9


def is_whole(media_type: MediaType, data: bytes, image: Any) -> bool:
    """Whether `data` (of `media_type`, opened by Pillow as `image`, nothing loaded) runs to its end marker."""
    if media_type is MediaType.PNG:
        try:
            image.verify()  # to IEND (SyntaxError for a CRC that does not match)
        except (OSError, EOFError, struct.error):
            return False  # a chunk cut short
        return _PNG_IEND in data[-PNG_IEND_WITHIN:]  # (Pillow's walk stops before IEND's CRC)
    if media_type is MediaType.JPEG:
        return _jpeg_whole(data)
    if media_type is MediaType.GIF:
        return _gif_whole(data)
    return True


def _jpeg_whole(data: bytes) -> bool:
    """SOI, then segments by their lengths, each scan's data to the next marker, up to EOI."""
    if not data.startswith(_JPEG_SOI):
        return False
    at = len(_JPEG_SOI)
    while True:
        if at >= len(data) or data[at] != 0xFF:
            return False
        while at < len(data) and data[at] == 0xFF:  # a marker may follow fill bytes
            at += 1
        if at >= len(data):
            return False
        marker = data[at]
        at += 1
        if marker == _JPEG_EOI:
            return True
        if marker in _JPEG_STANDALONE:
            continue
        length = int.from_bytes(data[at : at + 2], "big")
        if length < 2 or at + length > len(data):
            return False
        at += length
        if marker == _JPEG_SOS:
            at = _scan_end(data, at)
            if at < 0:
                return False


def _scan_end(data: bytes, at: int) -> int:
    """Where a scan's entropy-coded data ends (at the marker after it), or -1 when the file ends first:
    0xFF 0x00 is a stuffed byte and 0xFF 0xD0-D7 a restart marker, both inside the data."""
    while True:
        at = data.find(b"\xff", at)
        if at < 0 or at + 1 >= len(data):
            return -1
        following = data[at + 1]
        if following == 0x00 or 0xD0 <= following <= 0xD7:
            at += 2
        elif following == 0xFF:
            at += 1  # a fill byte before the marker
        else:
            return at


def _gif_whole(data: bytes) -> bool:
    """The screen descriptor and its colour table, then extensions and images by their sub-blocks,
    up to the trailer."""
    if len(data) < _GIF_SCREEN_BYTES:
        return False
    at = _GIF_SCREEN_BYTES + _colour_table_bytes(data[10])
    while 0 <= at < len(data):
        block = data[at]
        at += 1
        if block == _GIF_TRAILER:
            return True
        if block == _GIF_EXTENSION:
            at = _after_sub_blocks(data, at + 1)  # past its label
        elif block == _GIF_IMAGE and at + _GIF_DESCRIPTOR_BYTES <= len(data):
            at += _GIF_DESCRIPTOR_BYTES + _colour_table_bytes(data[at + _GIF_DESCRIPTOR_BYTES - 1])
            at = _after_sub_blocks(data, at + 1)  # past its LZW code size
        else:
            return False
    return False


def _colour_table_bytes(flags: int) -> int:
    return 3 << ((flags & 0x07) + 1) if flags & 0x80 else 0


def _after_sub_blocks(data: bytes, at: int) -> int:
    """Past a chain of sub-blocks (each its size, then that many bytes; a size of 0 ends it), or -1."""
    while at < len(data):
        size = data[at]
        at += 1 + size
        if size == 0:
            return at
    return -1
