"""gradwire: communication-efficient, straggler-tolerant distributed training for PyTorch."""

__version__ = "0.1.0"


def version() -> str:
    """The installed package's version, or the source tree's (``__version__``)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("gradwire")
    except PackageNotFoundError:
        return __version__
