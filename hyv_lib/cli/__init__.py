"""The command line, ``python -m hyv_lib COMMAND``: the parser and dispatch in commands, fine-tuning in training."""
