"""The package version (its own module, so that modules of the package read it without importing the package)."""

__version__ = "0.1.0"
