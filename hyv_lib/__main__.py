"""Entry point for ``python -m hyv_lib``."""

from .cli.commands import main

main()
