"""Image files as bytes, for the datasets the tests write: PNG through PIL, and 16-bit PNG written by hand."""

from __future__ import annotations

import io
import zlib

import numpy as np
import PIL.Image


def png_bytes(pixels: np.ndarray) -> bytes:
    """uint8 [H, W, C] (C = 1: gray, 3: RGB) as a PNG file."""
    buffer = io.BytesIO()
    PIL.Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels).save(buffer, format='png')
    return buffer.getvalue()


def png16_bytes(size: int, channels: int) -> bytes:
    """A 16-bit PNG (gray or RGB), written by hand from the PNG specification (PIL cannot write 16-bit RGB)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, 'big') + kind + data + zlib.crc32(kind + data).to_bytes(4, 'big')
    color_type = {1: 0, 3: 2}[channels]
    rows = b''.join(b'\x00' + (b'\xff\xff' * channels * size) for _ in range(size))  # Filter 0, all samples 65535.
    header = size.to_bytes(4, 'big') * 2 + bytes([16, color_type, 0, 0, 0])
    return b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', header) + chunk(b'IDAT', zlib.compress(rows)) + chunk(b'IEND', b'')
