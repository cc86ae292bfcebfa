"""``python -m mconv`` and ``python -m mconv.cli``: the command line. ``core/__main__.py`` is a
link to this file, so the entry point lives in the layer it starts, not in core."""

from mconv.cli.app import main

main()
