"""The raycse version (its own module: modules inside raycse read it without importing the package root)."""

__version__ = "0.1.0"
