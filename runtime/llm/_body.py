"""Reading a streamed httpx response body under trio, without leaks.

httpx hands the body out through a chain of async generators (httpx's
``aiter_bytes`` down to httpcore's connection). An async generator that is
dropped half-way is finalised later by trio, which warns about it, and the
connection it holds stays open until then. :class:`ResponseBody` makes sure
the chain always ends: at the end of the body; by an exception raised inside
it (a stall timeout cancels the read it is blocked in); or, when we stop
early, by reading on under an already-cancelled scope, so that the first
blocking read inside the chain raises ``Cancelled`` and every generator in
it unwinds and closes the connection.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import httpx
import trio

from ._exceptions import MalformedResponseError, ProviderConnectionError, ProviderError

__all__ = ["ResponseBody"]

logger = logging.getLogger("weald.runtime.llm")


class ResponseBody:
    """The body of a streamed response, read chunk by chunk.

    Args:
        response: A response from ``AsyncClient.send(..., stream=True)``.
        stall_timeout: The longest wait for one chunk, in seconds.
        stalled: Builds the error to raise when that wait runs out.
        describe: Names the response in error messages (e.g. the URL).
    """

    def __init__(
        self,
        response: httpx.Response,
        *,
        stall_timeout: float,
        stalled: Callable[[], ProviderError],
        describe: str,
    ) -> None:
        self._response = response
        self._stall_timeout = stall_timeout
        self._stalled = stalled
        self._describe = describe
        self._chunks: AsyncIterator[bytes] | None = None
        # Invariant: True once the generator chain has finished (ended, or an
        # exception came out of it), so nothing is left to unwind.
        self._finished = False

    async def receive(self) -> bytes | None:
        """Return the next chunk, or None at the end of the body.

        Raises:
            ProviderError: The stall timeout ran out (the ``stalled`` error),
                the connection broke, or the body cannot be decoded.
        """
        if self._finished:
            return None
        if self._chunks is None:
            self._chunks = self._response.aiter_bytes().__aiter__()
        try:
            with trio.fail_after(self._stall_timeout):
                return await self._chunks.__anext__()
        except StopAsyncIteration:
            self._finished = True
            return None
        except trio.TooSlowError as exc:
            self._finished = True
            raise self._stalled() from exc
        except httpx.TransportError as exc:
            self._finished = True
            raise ProviderConnectionError(
                f"the connection to {self._describe} broke mid-stream: {type(exc).__name__}: {exc}"
            ) from exc
        except httpx.DecodingError as exc:
            self._finished = True
            raise MalformedResponseError(f"cannot decode the response body from {self._describe}: {exc}") from exc
        except BaseException:
            self._finished = True
            raise

    async def read(self, limit: int) -> bytes:
        """Read the rest of the body, up to ``limit`` bytes, within the stall timeout.

        A body cut short by an error or the timeout is returned as far as it
        came: this is for error responses, whose status says enough.
        """
        parts: list[bytes] = []
        size = 0
        with trio.move_on_after(self._stall_timeout):
            while size < limit:
                try:
                    chunk = await self.receive()
                except ProviderError:
                    break
                if chunk is None:
                    break
                parts.append(chunk)
                size += len(chunk)
        return b"".join(parts)[:limit]

    async def drain(self, timeout: float, limit: int) -> None:
        """Read to the end of the body, briefly, so the connection can be reused.

        Gives up silently after ``timeout`` seconds or ``limit`` bytes; then
        :meth:`aclose` closes the connection instead.
        """
        size = 0
        with trio.move_on_after(timeout):
            while size <= limit:
                try:
                    chunk = await self.receive()
                except ProviderError:
                    return
                if chunk is None:
                    return
                size += len(chunk)

    async def aclose(self) -> None:
        """Unwind the generator chain and close the response. Idempotent.

        Safe to call while being cancelled: the close itself is shielded by
        httpcore, and unwinding needs no blocking read to complete.
        """
        try:
            if not self._finished and self._chunks is not None:
                self._finished = True
                with trio.CancelScope() as scope:
                    scope.cancel()
                    # Buffered chunks come out without blocking; the first
                    # read that would block raises Cancelled inside the chain.
                    while True:
                        await self._chunks.__anext__()
        except Exception:
            # The chain ended (StopAsyncIteration) or failed while unwinding;
            # either way it is done, and we are abandoning this response.
            logger.debug("abandoned %s", self._describe, exc_info=True)
        finally:
            await self._response.aclose()
