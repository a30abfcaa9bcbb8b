"""Run coroutines together; the first failure cancels the rest and is raised as itself."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Sequence, TypeVar

T = TypeVar("T")


async def run_all(coros: Sequence[Awaitable[T]]) -> list[T]:
    """Results of `coros` in order. On the first exception the others are cancelled (and awaited)
    and that exception is raised unwrapped (unlike a TaskGroup's ExceptionGroup)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    errors = [t.exception() for t in tasks if t in done and not t.cancelled()]  # marks all as retrieved
    failed = next((e for e in errors if e is not None), None)
    if failed is not None:
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        raise failed
    return [t.result() for t in tasks]

