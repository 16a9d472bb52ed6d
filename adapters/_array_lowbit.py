"""Placeholder: the generic (any array namespace) lowbit observers come with their issue."""

__all__: list[str] = []
