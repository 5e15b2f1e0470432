"""The package version (one place: the package root and result rows read it)."""

__version__ = "0.1.0"
