"""Placeholder: the calibration observers for torch come with their issue."""

__all__: list[str] = []
