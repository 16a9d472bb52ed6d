"""``python -m observers_core``: the ``observers-core`` command line (see observers_core.report._cli)."""

from observers_core.report._cli import entry_point

if __name__ == "__main__":
    entry_point()
