"""The one exception type users see: its message is the single line the CLI prints."""


class ProfkitError(Exception):
    """A problem with the user's input (bad trace, bad option), reported as one clear line."""


class TraceError(ProfkitError):
    """The input is not a trace profkit can read (or is damaged)."""
