"""The tests' clock: time the test moves, never the machine's."""

T0_MS = 1_800_000_000_000  # 2027-01-15T08:00:00Z, a whole second


class Clock:
    """The engine's clock on the test's own time: called, seconds (as time.time is); read, exact
    milliseconds (`now_ms`). The test moves it on (`advance`), and so do the engine's waits (`sleep`)."""

    def __init__(self, now_ms: int = T0_MS) -> None:
        self.now_ms = now_ms

    def __call__(self) -> float:
        return self.now_ms / 1000

    @property
    def seconds(self) -> float:
        return self.now_ms / 1000

    def advance(self, seconds: float) -> None:
        self.now_ms += round(seconds * 1000)

    def sleep(self, seconds: float) -> None:
        """A wait of the engine's: the time passes at once."""
        self.advance(seconds)
