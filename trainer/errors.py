"""The trainer's one error type: bad input that the user can fix."""


class TrainerError(Exception):
    """Bad input: reported as one ``trainer: error: ...`` line, exit code 2."""
