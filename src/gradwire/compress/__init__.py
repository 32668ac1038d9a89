"""Gradient compressors: a tensor in, the exact bytes that cross the wire out, and back.

``build("qsgd:levels=7,bucket=512")`` makes a compressor from a spec string; ``REGISTRY.describe()``
lists them all. See docs/compressors.md for wire formats, variance bounds and citations.
"""

from gradwire.compress import chunked, dense, natural, pquant, qsgd, randk, sign, sparse, terngrad  # noqa: F401
from gradwire.compress.base import REGISTRY, Compressor, CorruptPayload, Packet, build
from gradwire.compress.error_feedback import ErrorFeedback

__all__ = ["build", "REGISTRY", "Packet", "Compressor", "CorruptPayload", "ErrorFeedback"]
