# the C accelerator of analyze/reader/walker.py (analyze/reader/_skim.c)
from kvtrace.analyze.reader.walker import Walker

def skim(walker: Walker, text: str, pos: int, /) -> int: ...
def configure(
    memo: dict[str | bytes, int], codes: bytes, components: tuple[str, ...], drafter_code: int, /
) -> None: ...
