"""Placeholder: the calibration observers for jax come with their issue."""

__all__: list[str] = []
