"""The error of bad data, shared by every data format (microgpt.data, microgpt.text)."""


class DataError(ValueError):
    """A problem with the data a run was given; the message names the problem and the fix."""
