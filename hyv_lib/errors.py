"""The one exception type for bad user input: it names the argument and what is valid."""


class HyvInputError(ValueError):
    """Bad input to a stage or the CLI.

    ``argument`` is the flag or parameter name (e.g. ``"--video_length"``); the CLI prints
    ``error: <argument>: <message>`` on one line and exits with code 2.
    """

    def __init__(self, argument: str, message: str):
        self.argument = argument
        self.message = message
        super().__init__(f"{argument}: {message}")
