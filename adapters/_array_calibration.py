"""Placeholder: the generic (any array namespace) calibration observers come with their issue."""

__all__: list[str] = []
