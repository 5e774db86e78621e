"""The package version, in a module of its own: modules below the package root (run records,
exported models) read it without importing the root, which imports them lazily."""

__version__ = "0.1.0"
