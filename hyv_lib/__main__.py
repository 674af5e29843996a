"""Entry point for ``python -m hyv_lib``."""

from .cli import main

main()
