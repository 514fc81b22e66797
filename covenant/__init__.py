"""covenant: a process-supervisor daemon for agents on Linux."""

__all__ = ["__version__"]

__version__ = "0.1.0"
