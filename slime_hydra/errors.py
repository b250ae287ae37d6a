"""The one error type a user sees: what is wrong, with which value, and which override fixes it."""


class SlimeHydraError(ValueError):
    """A problem with the user's input or config; printed as one paragraph, without a traceback."""
