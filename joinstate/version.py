"""The joinstate version, in a module of its own.

``pyproject.toml`` reads it statically; modules inside the package that record it (a
checkpoint manifest) import it from here rather than from the package root, which
imports them.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
