"""Streaming an answer: each chunk carries only text no later step can change.

The sampler hands a row's streamer its tokens as they become final (the leftmost generated prefix with no [MASK]
left in it: `hf_mdm.generation_stopping.Streamer`), from the generation thread; `RowStream` passes them to the
event loop. `TextSoFar` turns the final tokens into final text with the cuts the whole answer gets
(`hf_mdm.serve.engine.Engine.text_of`: first EOS, first stop string), holding back what a later token may still
change: an incomplete character, and an ending that could begin a stop string. So the chunks join to the text of
the non-streamed answer.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

__all__ = ["RowStream", "TextSoFar"]

_END = object()


class RowStream:
    """A transformers-style streamer (``put``, ``end``) for one row that forwards its tokens to an asyncio queue;
    the first ``put`` (the prompt) is skipped. `close` ends it from the event loop (a job that failed ends no
    stream); `restart` readies it for running its job again, when nothing was forwarded yet."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.queue = loop, asyncio.Queue()
        self._prompt_seen = False
        self.forwarded = False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        tokens = value.flatten().tolist()
        self.forwarded = True
        self.loop.call_soon_threadsafe(self.queue.put_nowait, tokens)

    def end(self) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, _END)

    def close(self) -> None:
        """Ends the stream (from the event loop's thread)."""
        self.queue.put_nowait(_END)

    def restart(self) -> bool:
        """Whether the job may run again on this stream (nothing forwarded yet); if so its prompt is skipped again."""
        self._prompt_seen = self.forwarded
        return not self.forwarded

    async def next(self) -> Optional[list[int]]:
        """The next final tokens, or None at the end."""
        item = await self.queue.get()
        return None if item is _END else item


class TextSoFar:
    """The final text of a row's tokens so far, and what of it is new (`delta`)."""

    def __init__(self, engine: Any, job: Any):
        self.engine, self.job = engine, job
        self.tokens: list[int] = []
        self.sent = ""
        self.stopped = False

    def add(self, tokens: list[int]) -> str:
        """The text to send after ``tokens`` became final (possibly empty)."""
        self.tokens += tokens
        text, reason, _ = self.engine.text_of(self.job, self.tokens, final=False)
        if reason or any(t in self.engine.eos_ids for t in self.tokens):
            self.stopped = True  # cut at a stop string or EOS: this text is the answer's
            return self._delta(text)
        return self._delta(_safe(text, self.job.stops))

    def _delta(self, text: str) -> str:
        if not text.startswith(self.sent) or len(text) <= len(self.sent):
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta

    def rest(self, final_text: str) -> str:
        """What is left to send of the answer's text."""
        return final_text[len(self.sent) :] if final_text.startswith(self.sent) else ""


def _safe(text: str, stops: list[str]) -> str:
    """``text`` without what a later token may change: a trailing incomplete character (decoded as U+FFFD) and a
    trailing piece that begins a stop string."""
    text = text.rstrip("\ufffd")
    hold = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:size]):
                hold = max(hold, size)
                break
    return text[: len(text) - hold] if hold else text
