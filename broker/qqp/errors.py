"""The codec's one error type: whatever a peer sends, the codec raises only this."""


class QQPError(ValueError):
    """Malformed QQP input (framing or SXDF syntax); the receiver answers 5xx and closes."""


class OverLimit(QQPError):
    """An item larger than ItemLimit, or one that would exceed the SessionLimit."""

    def __init__(self, text: str, *, session: bool) -> None:
        super().__init__(text)
        self.session = session  # True: the SessionLimit; False: the ItemLimit
