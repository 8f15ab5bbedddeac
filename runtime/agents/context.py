"""An agent's context: the part of its conversation the next model request sends, kept under the window.

The history in the store is the whole conversation and is only ever
appended to. The context is what the agent holds in memory and sends: its
messages since the last compaction, led by that compaction's summary, with
the bodies of old tool results pruned. So an agent's memory is bounded by
its model's window, however long it runs.

Before each model call the agent estimates the request's size in tokens,
anchored on the last reported usage: the input tokens (cached or not) the
last answered request had, plus the characters added (or removed) since,
divided by a characters-per-token ratio. The ratio starts at 4 and is
measured from the reports themselves: the change in characters between two
requests over the change in reported tokens, so that a server's fixed
overhead (framing, tool schemas it counts differently) does not skew it. A
server's "too long" error calibrates it too, when it says the request's
size. The calibration (`Calibration`: the ratio, the anchor, the measured
cost of the system prompt and tools, a window the server named) is stored
on the agent's record, so an agent restarted, restored or woken from
hibernation estimates as it did before. An estimate not anchored on a
report yet is a guess (tool schemas a server does not count, a ratio of 4)
and never prunes or compacts on its own: the request is sent, and measured.
When a calibrated estimate exceeds the input budget (the window less the
output reserve, see `weald.runtime.llm.ModelLimits`):

1. **Prune**: tool results older than the last ``keep_tool_results`` model
   steps get a one-line stub instead of their body; the stub says how to read
   the output again (the ``recall`` tool; the full output stays in the
   store). If that is not enough, the oldest protected steps' results go
   too, one step at a time, down to the last step. The boundary is stored
   on the agent's record.
2. **Compact**, if still too large: the older part of the context is sent to
   the agent's own model as a transcript with a dedicated prompt, and the
   answer becomes a summary message. The context goes on as that summary
   plus the most recent messages (those that fit in ``keep_recent`` of the
   budget). The summary is appended to the history with a `CompactionMark`
   naming the first message kept: on a restart the context is rebuilt from
   the last such entry, so a crash in the middle of a compaction leaves the
   previous context, never half of one. A summary that would not make the
   context smaller is discarded, and the context kept as it was.

A message can be *left out* of the context and stay in the history (its
entry says why): a prompt too large for the model even alone, refused
before its turn, and the prompts of a turn that failed because its
request did not fit, so that the next prompt starts from a context that does.

`Context` holds the messages and does the arithmetic; the agent decides
when, calls the model and writes the store.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Final

import attrs
import msgspec
from weald.runtime.llm import Message, ModelLimits, ModelRequest, ToolSpec, Usage

__all__ = [
    "SUMMARY_PROMPT",
    "Calibration",
    "CompactionMark",
    "Context",
    "ContextConfig",
    "ContextStats",
    "is_summary",
    "message_chars",
    "pruned_stub",
    "summary_message",
]

#: The system prompt of a compaction request, unless ``[context] summary_prompt`` replaces it.
SUMMARY_PROMPT: Final = (
    "You compact the conversation of a coding agent so that it can go on working in a smaller context. "
    "Write a summary that lets the agent continue without the original messages: what the user asked for "
    "and every constraint they gave; decisions taken and why; files read or changed, with their paths, and "
    "what was learned from them; commands run and their outcomes; errors met and how they were handled; "
    "what is done and what remains to do next. Keep exact names, paths, numbers and identifiers. Be concise "
    "and factual and invent nothing. Write plain text with no preamble."
)

# What leads a summary message in the context and the history.
_SUMMARY_HEADER: Final = (
    "[Summary of the conversation before this point, written when it was compacted; "
    "the earlier messages are kept in the agent's history.]\n\n"
)

# Characters counted per message on top of its text: role and framing tokens.
_MESSAGE_OVERHEAD: Final = 16

# What an image is counted as: about what providers bill for a small one (~100 tokens).
_IMAGE_CHARS: Final = 400

# A tool result shorter than this is never pruned: its stub would not be much shorter.
_PRUNE_MIN_CHARS: Final = 400

# How much of each tool result and tool call a compaction transcript quotes.
_TRANSCRIPT_TOOL_CHARS: Final = 2000
_TRANSCRIPT_CALL_CHARS: Final = 300
# The shortest transcript a summary request sends, however small the window.
_MIN_TRANSCRIPT_CHARS: Final = 200

# The bounds of a calibrated characters-per-token ratio.
_MIN_CPT: Final = 0.5
_MAX_CPT: Final = 16.0
_DEFAULT_CPT: Final = 4.0
# A first report's overall ratio is believed only in this range (a server that
# counts no tool schemas would make it absurd); later ones measure the margin.
_PLAUSIBLE_CPT: Final = (1.0, 8.0)
# Two reports measure the ratio only when they differ by this much.
_MIN_CALIBRATION_CHARS: Final = 1000
_MIN_CALIBRATION_TOKENS: Final = 50


@attrs.frozen
class ContextConfig:
    """How an agent keeps its requests under its model's context window (``[context]`` in weald.toml).

    Attributes:
        auto: prune and compact automatically when a step would not fit;
            False leaves only ``agent.compact`` and the retry after a
            server's context-length error.
        keep_tool_results: tool results of the last this many model steps
            are never pruned.
        keep_recent: the share of the input budget that the most recent
            messages may fill and still be kept whole by a compaction.
        summary_prompt: replaces the built-in summary prompt (`SUMMARY_PROMPT`).
    """

    auto: bool = True
    keep_tool_results: int = attrs.field(default=3, validator=attrs.validators.ge(0))
    keep_recent: float = attrs.field(default=0.3, validator=[attrs.validators.gt(0), attrs.validators.lt(1)])
    summary_prompt: str | None = None


class CompactionMark(msgspec.Struct, kw_only=True, frozen=True):
    """Stored with a summary in the history: the context starts again here.

    Attributes:
        first_kept: the sequence number of the first message kept after the summary.
        replaced: how many messages of the context the summary replaced.
        tokens_before: the estimated size of the context before, in tokens.
        tokens_after: its estimated size after.
        reason: ``"auto"`` (it would not fit), ``"overflow"`` (the server
            refused a request as too long) or ``"manual"`` (``agent.compact``).
    """

    first_kept: int
    replaced: int
    tokens_before: int
    tokens_after: int
    reason: str


class Calibration(msgspec.Struct, kw_only=True, frozen=True):
    """What the estimate has learnt from the model's reports, stored on the agent's record.

    It survives a restart, a restore and hibernation: an agent woken up
    estimates its context as it did when it went to sleep, instead of
    guessing again from the tools' schemas at 4 characters a token.

    Attributes:
        model: the model it was measured on (another model starts over).
        chars_ratio: characters per token for what changes between requests.
        anchor_chars: the characters of the last measured request.
        anchor_tokens: the input tokens reported for it (0: never measured).
        fixed_chars: the characters of its system prompt and tools' schemas;
            with the two above, what they really cost (a server may not count
            the schemas at all).
        last_input_tokens: the input tokens the last answer reported.
        window: a context window a server named when it refused a request,
            smaller than the configured one; None if none did.
        window_of: the window the model had before (configured, known or
            the default): the server's is used again only while that is
            unchanged (a configuration that now says otherwise wins).
    """

    model: str = ""
    chars_ratio: float = 4.0
    anchor_chars: int = 0
    anchor_tokens: int = 0
    fixed_chars: int = 0
    last_input_tokens: int = 0
    window: int | None = None
    window_of: int | None = None


class ContextStats(msgspec.Struct, frozen=True, kw_only=True):
    """The context as ``debug_state`` and ``agent.list`` show it.

    A msgspec Struct rather than frozen attrs: every tool batch's snapshot
    makes one, and a Struct is built in a twentieth of the time.

    Attributes:
        context_window: the model's window, in tokens.
        output_reserve: tokens kept free for the answer.
        window_source: where the window came from (see `ModelLimits.source`).
        input_budget: the most tokens a request may hold.
        tokens: the estimated size of the next request (system prompt,
            tools and messages), in tokens.
        chars_ratio: characters per token, the ratio the estimate uses for
            what was added since the last report (not named ``..._token``:
            such names are taken for secrets and redacted).
        calibrated: whether the estimate is anchored on a reported usage yet.
        last_input_tokens: the input tokens the last answer reported (cached included).
        fixed_tokens: what the system prompt and the tools' schemas cost, as
            measured (estimated at ``chars_ratio`` until a report anchors it).
        messages: messages in the context.
        summarized: whether the context starts with a compaction's summary.
        compactions: compactions of this agent so far.
        pruned_before: tool results with a lower sequence number are pruned.
    """

    context_window: int
    output_reserve: int
    window_source: str
    input_budget: int
    tokens: int
    chars_ratio: float
    calibrated: bool
    last_input_tokens: int
    fixed_tokens: int
    messages: int
    summarized: bool
    compactions: int
    pruned_before: int


def pruned_stub(message: Message, seq: int) -> Message:
    """A tool result with its body replaced by a stub that says how to get it back."""
    what = f"{message.name} output" if message.name else "tool output"
    if message.images:
        what += f" and its {len(message.images)} image(s)"
    text = (
        f"[{what} pruned from the context ({len(message.content)} characters) to save space; it is kept in full: "
        f'call recall with {{"seq": {seq}}} to read it again]'
    )
    return msgspec.structs.replace(message, content=text, images=[])


def summary_message(text: str) -> Message:
    """The message a compaction's summary becomes."""
    return Message(role="user", content=_SUMMARY_HEADER + text.strip())


def is_summary(message: Message) -> bool:
    """Whether ``message`` is a compaction's summary."""
    return message.role == "user" and message.content.startswith(_SUMMARY_HEADER)


def message_chars(message: Message) -> int:
    """The characters a message adds to a request, framing included (an image counts as `_IMAGE_CHARS`)."""
    chars = len(message.content) + _MESSAGE_OVERHEAD + len(message.images) * _IMAGE_CHARS
    for call in message.tool_calls:  # most messages have none
        chars += len(call.name) + len(call.raw_arguments) + _MESSAGE_OVERHEAD
    return chars


class Context:
    """The messages the next model request sends, and the estimate of their size.

    Owned by one agent actor and touched only in its context (not thread-safe).

    Args:
        limits: the model's window and output reserve.
        config: pruning and compaction settings.
    """

    # Slots, and no per-message size list: 10,000 idle agents each hold one of these.
    __slots__ = (
        "_anchor_chars",
        "_anchor_fixed",
        "_anchor_tokens",
        "calibrated",
        "chars",
        "chars_per_token",
        "compactions",
        "config",
        "last_input_tokens",
        "limits",
        "messages",
        "pruned_before",
        "sent_chars",
        "sent_fixed",
        "seqs",
        "server_window",
        "window_of",
    )

    def __init__(self, limits: ModelLimits, config: ContextConfig | None = None) -> None:
        self.limits = limits
        self.config = config if config is not None else ContextConfig()
        # Invariant: messages and seqs have one entry per message of the context,
        # in order; chars == sum(message_chars(m) for m in messages). A summary
        # leads when there is one.
        self.messages: list[Message] = []
        self.seqs: list[int] = []
        self.chars = 0
        # The request in flight (what its usage report calibrates): its characters,
        # and those of its system prompt and tools.
        self.sent_chars = 0
        self.sent_fixed = 0
        self.chars_per_token = _DEFAULT_CPT
        self.calibrated = False
        # The last reported request: its characters, its input tokens (0, 0: none
        # yet) and the characters of its system prompt and tools.
        self._anchor_chars = 0
        self._anchor_tokens = 0
        self._anchor_fixed = 0
        self.last_input_tokens = 0
        self.server_window: int | None = None  # a window a server named, smaller than the configured one
        self.window_of: int | None = None  # the window the model had before the server named one
        self.compactions = 0
        self.pruned_before = 0

    # -- building ---------------------------------------------------------------------------

    def load(self, entries: Sequence[tuple[int, Message, CompactionMark | None]], *, pruned_before: int = 0) -> None:
        """Rebuild the context from stored history entries (oldest first).

        The last entry with a mark starts the context (its summary, then the
        messages from its ``first_kept`` on); without one, every message
        given is in it. Tool results below ``pruned_before`` are stubbed.
        """
        last_mark = None
        for index in range(len(entries) - 1, -1, -1):
            if entries[index][2] is not None:
                last_mark = index
                break
        self.messages, self.seqs, self.chars = [], [], 0
        if last_mark is not None:
            seq, summary, mark = entries[last_mark]
            assert mark is not None
            self._add(seq, summary)
            for entry_seq, message, entry_mark in entries:
                if entry_mark is None and entry_seq >= mark.first_kept:
                    self._add(entry_seq, message)
        else:
            for entry_seq, message, entry_mark in entries:
                if entry_mark is None:
                    self._add(entry_seq, message)
        self.pruned_before = 0
        self._prune_below(pruned_before, len(self.messages))

    def append(self, seq: int, message: Message) -> None:
        """Add a message at the end (it is in the store under ``seq``)."""
        self._add(seq, message)

    def _add(self, seq: int, message: Message) -> None:
        self.messages.append(message)
        self.seqs.append(seq)
        self.chars += message_chars(message)

    def _replace(self, index: int, message: Message) -> None:
        self.chars += message_chars(message) - message_chars(self.messages[index])
        self.messages[index] = message

    # -- size -----------------------------------------------------------------------------------

    def request_chars(self, system: str | None, tools: Sequence[ToolSpec]) -> int:
        """The characters of a request with this context, the system prompt and these tools."""
        return self.chars + len(system or "") + _tools_chars(tools)

    def tokens_for(self, chars: int) -> int:
        """A request of ``chars`` characters in estimated tokens (anchored on the last report)."""
        if not self.calibrated:
            return math.ceil(chars / self.chars_per_token)
        return max(0, self._anchor_tokens + math.ceil((chars - self._anchor_chars) / self.chars_per_token))

    def estimate(self, system: str | None, tools: Sequence[ToolSpec]) -> int:
        """The estimated tokens of a request with this context."""
        return self.tokens_for(self.request_chars(system, tools))

    def calibrate(self, request_chars: int, usage: Usage, fixed_chars: int = 0) -> None:
        """Anchor the estimate on the usage a request of ``request_chars`` reported.

        ``fixed_chars`` are the request's system prompt and tools' characters.
        """
        reported = usage.total_input_tokens
        if reported <= 0 or request_chars <= 0:
            return
        self.last_input_tokens = reported
        self._measure(request_chars, reported, fixed_chars)

    def learn_overflow(
        self, request_chars: int, limit: int | None, requested: int | None, fixed_chars: int = 0
    ) -> None:
        """A server refused a request of ``request_chars`` as too long, and perhaps said its sizes."""
        if requested and request_chars > 0:
            self._measure(request_chars, requested, fixed_chars)
        if limit:
            narrowed = self.limits.narrowed(limit)
            if narrowed is not self.limits:
                if self.window_of is None:
                    self.window_of = self.limits.context_window
                self.limits = narrowed
                self.server_window = narrowed.context_window

    def calibration(self, model: str) -> Calibration:
        """What the estimate has learnt, to store (see `restore`)."""
        return Calibration(
            model=model,
            chars_ratio=self.chars_per_token,
            anchor_chars=self._anchor_chars if self.calibrated else 0,
            anchor_tokens=self._anchor_tokens if self.calibrated else 0,
            fixed_chars=self._anchor_fixed if self.calibrated else 0,
            last_input_tokens=self.last_input_tokens,
            window=self.server_window,
            window_of=self.window_of,
        )

    def restore(self, calibration: Calibration | None, model: str) -> None:
        """Estimate as a stored `calibration` did, if it was measured on ``model``; call after setting `limits`."""
        if calibration is None or calibration.model != model:
            return
        self.chars_per_token = min(_MAX_CPT, max(_MIN_CPT, calibration.chars_ratio))
        self.last_input_tokens = calibration.last_input_tokens
        if calibration.anchor_tokens > 0 and calibration.anchor_chars > 0:
            self._anchor_chars = calibration.anchor_chars
            self._anchor_tokens = calibration.anchor_tokens
            self._anchor_fixed = calibration.fixed_chars
            self.calibrated = True
        if calibration.window is not None and calibration.window_of == self.limits.context_window:
            self.learn_overflow(0, calibration.window, None)

    def forget_calibration(self) -> None:
        """Estimate from scratch again (another model: another tokenizer, another window)."""
        self.chars_per_token = _DEFAULT_CPT
        self.calibrated = False
        self._anchor_chars = self._anchor_tokens = self._anchor_fixed = 0
        self.last_input_tokens = 0
        self.server_window = self.window_of = None

    def fixed_tokens(self, system: str | None, tools: Sequence[ToolSpec]) -> int | None:
        """What the system prompt and the tools' schemas cost, as measured; None before any measure.

        The anchored request's tokens less its messages' (at the ratio) are
        theirs; a system prompt or tool set that changed since adds or
        removes its difference at the ratio.
        """
        if not self.calibrated:
            return None
        fixed = len(system or "") + _tools_chars(tools)
        messages = math.ceil((self._anchor_chars - self._anchor_fixed) / self.chars_per_token)
        measured = max(0, self._anchor_tokens - messages)
        return max(0, measured + math.ceil((fixed - self._anchor_fixed) / self.chars_per_token))

    def message_tokens(self, message: Message) -> int:
        """A message's estimated tokens alone."""
        return math.ceil(message_chars(message) / self.chars_per_token)

    def room_for(self, system: str | None, tools: Sequence[ToolSpec]) -> int:
        """The tokens one message may take and still fit a request alone, after the system prompt and tools.

        Measured when the estimate is anchored; before that only the system
        prompt is counted (the tools' cost is unknown: a server may not count them).
        """
        fixed = self.fixed_tokens(system, tools)
        if fixed is None:
            fixed = math.ceil(len(system or "") / self.chars_per_token)
        return self.budget - fixed - math.ceil(_MESSAGE_OVERHEAD / self.chars_per_token)

    def _measure(self, chars: int, tokens: int, fixed: int) -> None:
        if self.calibrated:
            added_chars = chars - self._anchor_chars
            added_tokens = tokens - self._anchor_tokens
            if abs(added_chars) >= _MIN_CALIBRATION_CHARS and abs(added_tokens) >= _MIN_CALIBRATION_TOKENS:
                ratio = added_chars / added_tokens
                if ratio > 0:
                    self.chars_per_token = min(_MAX_CPT, max(_MIN_CPT, ratio))
        elif _PLAUSIBLE_CPT[0] <= chars / tokens <= _PLAUSIBLE_CPT[1]:
            self.chars_per_token = chars / tokens
        self._anchor_chars = chars
        self._anchor_tokens = tokens
        self._anchor_fixed = fixed
        self.calibrated = True

    @property
    def budget(self) -> int:
        """The most tokens a request may hold."""
        return self.limits.input_budget

    # -- pruning --------------------------------------------------------------------------------

    def prune(self) -> int:
        """Stub the tool results older than the last ``keep_tool_results`` steps; returns how many.

        ``pruned_before`` moves up to the first kept step's sequence number.
        """
        keep = self.config.keep_tool_results
        steps = [i for i, m in enumerate(self.messages) if m.role == "assistant"]
        if len(steps) <= keep:
            return 0
        cut = steps[-keep] if keep > 0 else len(self.messages)
        return self._prune_below(self.seqs[cut] if cut < len(self.seqs) else self.seqs[-1] + 1, cut)

    def prune_step(self) -> int | None:
        """Stub the tool results of the oldest step not pruned yet, unless it is the last; returns how many.

        None when only the last step's results are left. Called again and
        again while the request is too large, before compacting: a step's
        outputs are worth less than a model call to summarize.
        """
        messages = self.messages
        # The first step boundary above the pruned part: everything before it goes (at the
        # last step's boundary, that is every result but the last step's).
        for index in range(bisect.bisect_right(self.seqs, self.pruned_before, lo=self._first_plain()), len(messages)):
            if messages[index].role == "assistant":
                return self._prune_below(self.seqs[index], index)
        return None

    def _first_plain(self) -> int:
        """The index of the first message after a leading summary: the seqs from there on ascend.

        (A summary is stored after the messages it keeps, so its seq is higher than theirs.)
        """
        return 1 if self.messages and is_summary(self.messages[0]) else 0

    def prune_all_but_last_step(self) -> int:
        """Stub every tool result but those of the last step (a last resort); returns how many."""
        steps = [i for i, m in enumerate(self.messages) if m.role == "assistant"]
        if not steps:
            return 0
        return self._prune_below(self.seqs[steps[-1]], steps[-1])

    def prune_all(self) -> int:
        """Stub every tool result, the last step's too (its turn has ended); returns how many."""
        if not self.messages:
            return 0
        return self._prune_below(self.seqs[-1] + 1, len(self.messages))

    def output_room(self, system: str | None, tools: Sequence[ToolSpec]) -> int:
        """The tokens new tool results may take and the next request still fit.

        What the context can hold now, once old outputs are pruned; or, when
        the context is fuller than a compaction would leave it, what a
        compaction leaves (the budget less ``keep_recent`` of it and the
        system prompt and tools): results that large make the next step
        compact first, rather than reach the model cut ever shorter while
        old messages and stubs fill the context. Before a report anchors the
        estimate, only the system prompt is counted besides the messages (the
        tools' cost is unknown).
        """
        floor = self.floor_chars()
        fixed = self.fixed_tokens(system, tools)
        if fixed is None:
            fixed = math.ceil(len(system or "") / self.chars_per_token)
            now = self.budget - fixed - math.ceil(floor / self.chars_per_token)
        else:
            now = self.budget - self.tokens_for(floor + len(system or "") + _tools_chars(tools))
        after_compaction = int(self.budget * (1 - self.config.keep_recent)) - fixed
        return max(now, after_compaction)

    def floor_chars(self) -> int:
        """The context's characters if every tool result were pruned: what pruning cannot take away."""
        chars = self.chars
        # Only results at or above pruned_before are whole still.
        for index in range(
            bisect.bisect_left(self.seqs, self.pruned_before, lo=self._first_plain()), len(self.messages)
        ):
            message = self.messages[index]
            if message.role == "tool" and (len(message.content) >= _PRUNE_MIN_CHARS or message.images):
                chars -= message_chars(message) - message_chars(pruned_stub(message, self.seqs[index]))
        return chars

    def leave_out(self, seqs: Sequence[int]) -> list[Message]:
        """Take the messages with these sequence numbers out of the context; returns them."""
        wanted = set(seqs)
        taken = []
        for index in range(len(self.messages) - 1, -1, -1):
            if self.seqs[index] in wanted:
                taken.append(self.messages[index])
                self.chars -= message_chars(self.messages[index])
                del self.messages[index]
                del self.seqs[index]
        taken.reverse()
        return taken

    def _prune_below(self, seq: int, end: int) -> int:
        """Stub tool results with a sequence number below ``seq`` among the first ``end`` messages."""
        if seq <= self.pruned_before:
            return 0
        pruned = 0
        for index in range(min(end, len(self.messages))):
            message = self.messages[index]
            at = self.seqs[index]
            big = len(message.content) >= _PRUNE_MIN_CHARS or message.images
            if message.role == "tool" and self.pruned_before <= at < seq and big:
                self._replace(index, pruned_stub(message, at))
                pruned += 1
        self.pruned_before = seq
        return pruned

    # -- compaction -------------------------------------------------------------------------------

    def compaction_split(self) -> int | None:
        """Where to cut for a compaction: messages before the index are summarized; None: nothing to do.

        The kept part is the longest run of recent messages that starts a
        step (a user or assistant message, never a tool result) and fits in
        ``keep_recent`` of the budget, or of the context if that is smaller
        (a compaction asked for by hand shrinks a small context too); at
        least the last step is kept.
        """
        keep_chars = self.config.keep_recent * min(self.budget * self.chars_per_token, self.chars)
        first = 1 if self.messages and is_summary(self.messages[0]) else 0
        best = None
        last_boundary = None
        total = 0
        for index in range(len(self.messages) - 1, first, -1):
            total += message_chars(self.messages[index])
            if self.messages[index].role == "tool":
                continue
            if last_boundary is None:
                last_boundary = index
            if total > keep_chars:
                break
            best = index
        split = best if best is not None else last_boundary
        if split is None:
            return None
        older = self.messages[first:split]
        if len(older) < 2 and not any(m.role == "assistant" for m in older):
            return None  # only one prompt (or only the last summary) before the cut: nothing worth a summary
        return split

    def compaction_request(self, split: int, *, model_chars: int | None = None) -> ModelRequest:
        """The request that asks the model to summarize the messages before ``split``.

        The messages go as one transcript in a user message (no tool calls
        or tool results on the wire, so no provider's pairing rules apply),
        cut in the middle to ``model_chars`` characters when longer.
        """
        prompt = self.config.summary_prompt or SUMMARY_PROMPT
        limit = model_chars if model_chars is not None else self.transcript_chars()
        transcript = _transcript(self.messages[:split], max(_MIN_TRANSCRIPT_CHARS, limit))
        text = f"The conversation to summarize:\n\n{transcript}\n\nWrite the summary now."
        return ModelRequest(
            model="", messages=[Message(role="user", content=text)], system=prompt, purpose="compaction"
        )

    def transcript_chars(self) -> int:
        """How long a summary request's transcript may be: most of the budget, less the summary prompt."""
        prompt = self.config.summary_prompt or SUMMARY_PROMPT
        room = self.budget * self.chars_per_token - len(prompt) - _MESSAGE_OVERHEAD * 4
        return max(_MIN_TRANSCRIPT_CHARS, int(room * 0.8))

    def chars_after_compaction(self, split: int, summary: Message) -> int:
        """The context's characters if the messages before ``split`` were replaced by ``summary``."""
        return self.chars - sum(message_chars(m) for m in self.messages[:split]) + message_chars(summary)

    def apply_compaction(self, split: int, seq: int, summary: Message) -> None:
        """Replace the messages before ``split`` by ``summary`` (stored under ``seq``)."""
        kept = list(zip(self.messages[split:], self.seqs[split:], strict=True))
        self.messages, self.seqs, self.chars = [], [], 0
        self._add(seq, summary)
        for message, at in kept:
            self._add(at, message)
        self.compactions += 1

    # -- introspection ------------------------------------------------------------------------------

    def stats(self, system: str | None, tools: Sequence[ToolSpec]) -> ContextStats:
        """The figures ``debug_state`` and ``agent.list`` show."""
        return ContextStats(
            context_window=self.limits.context_window,
            output_reserve=self.limits.output_reserve,
            window_source=self.limits.source,
            input_budget=self.budget,
            tokens=self.estimate(system, tools),
            chars_ratio=round(self.chars_per_token, 3),
            calibrated=self.calibrated,
            last_input_tokens=self.last_input_tokens,
            fixed_tokens=self._fixed_or_guess(system, tools),
            messages=len(self.messages),
            summarized=bool(self.messages) and is_summary(self.messages[0]),
            compactions=self.compactions,
            pruned_before=self.pruned_before,
        )

    def _fixed_or_guess(self, system: str | None, tools: Sequence[ToolSpec]) -> int:
        fixed = self.fixed_tokens(system, tools)
        if fixed is None:
            fixed = math.ceil((len(system or "") + _tools_chars(tools)) / self.chars_per_token)
        return fixed

    def fixed_chars(self, system: str | None, tools: Sequence[ToolSpec]) -> int:
        """The characters of a request's system prompt and tools' schemas."""
        return len(system or "") + _tools_chars(tools)


# The size of each tool set seen, by its names: schemas change rarely, and every agent
# of a daemon offers one of a few sets. Bounded: cleared when it grows past the bound.
_TOOL_SETS: dict[tuple[str, ...], int] = {}
_TOOL_SETS_MAX: Final = 256


def _tools_chars(tools: Sequence[ToolSpec]) -> int:
    names = tuple(tool.name for tool in tools)
    chars = _TOOL_SETS.get(names)
    if chars is None:
        chars = sum(
            len(t.name) + len(t.description) + len(msgspec.json.encode(t.parameters)) + _MESSAGE_OVERHEAD for t in tools
        )
        if len(_TOOL_SETS) >= _TOOL_SETS_MAX:
            _TOOL_SETS.clear()
        _TOOL_SETS[names] = chars
    return chars


def _transcript(messages: Sequence[Message], limit: int) -> str:
    """The messages as plain text for a summary request, at most ``limit`` characters (cut in the middle)."""
    parts: list[str] = []
    for message in messages:
        if message.role == "user":
            label = "Earlier summary" if is_summary(message) else "User"
            parts.append(f"{label}: {message.content}")
        elif message.role == "assistant":
            lines = [f"Assistant: {message.content}"] if message.content else []
            lines.extend(
                f"[Assistant called {call.name} {call.raw_arguments[:_TRANSCRIPT_CALL_CHARS]}]"
                for call in message.tool_calls
            )
            parts.append("\n".join(lines) or "Assistant: (no text)")
        else:
            body = message.content
            if len(body) > _TRANSCRIPT_TOOL_CHARS:
                body = body[:_TRANSCRIPT_TOOL_CHARS] + f" [... {len(body) - _TRANSCRIPT_TOOL_CHARS} more characters]"
            failed = " (failed)" if message.is_error else ""
            parts.append(f"[Result of {message.name or 'a tool'}{failed}: {body}]")
    text = "\n\n".join(parts)
    if len(text) <= limit:
        return text
    # The start (an earlier summary, the first request) and the most recent part matter most.
    head = limit // 3
    tail = limit - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n\n[... {omitted} characters of the conversation omitted ...]\n\n{text[-tail:]}"
