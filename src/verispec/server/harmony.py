"""gpt-oss's harmony format in answers: its reasoning, its answer, its tool calls.

gpt-oss writes messages, each a header then `<|message|>` then a body that a special token ends:

    <|channel|>analysis<|message|>The user wants ...<|end|>
    <|start|>assistant<|channel|>final<|message|>Paris.<|return|>
    <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>

(the first message's `<|start|>assistant` is the prompt's; a call's recipient may also follow its channel:
`<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>`). A message on the analysis channel is
reasoning (`reasoning_content`, a Responses reasoning item); one to `functions.NAME` is a call of NAME, its body the
arguments; any other (final, a commentary preamble) is the answer's content. `<|end|>`, `<|return|>` and `<|call|>` end
a body; an answer cut by max_tokens ends its last body where it stops. Text before any header marker (a model that
does not write harmony) is content: a header longer than HEADER_CHARS without its `<|message|>` is taken as such.

Reading is token by token (`HarmonyReader.feed`), so a stream sends each piece as it is written and a finished answer
is the same reader run over all of its tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..decoding.detokenizer import IncrementalText
from ..models.tokenizer import Tokenizer

if TYPE_CHECKING:
    from .tools import ToolRequest

HEADER_CHARS = 256  # a header without <|message|> past this many characters is text the model wrote, not a header
_ENDS = ("<|end|>", "<|return|>", "<|call|>")
_HEADERS = ("<|start|>", "<|channel|>", "<|constrain|>")  # a header's markers: one in a body begins a header
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")


def is_harmony(tokenizer: Tokenizer) -> bool:
    """Whether the vocabulary is harmony's (gpt-oss): its channel and message markers are tokens of their own."""
    return all(tokenizer.raw.token_to_id(t) is not None for t in ("<|channel|>", "<|message|>", "<|return|>"))


@dataclass
class Piece:
    """What one more token added: reasoning text, content text, a call opened (its index and name), or more of the
    arguments of call `index`."""

    kind: str  # reasoning | content | call | arguments | end (of call `index`'s arguments)
    text: str = ""
    index: int = -1


@dataclass
class HarmonyReader:
    tokenizer: Tokenizer
    reasoning: str = ""
    content: str = ""
    calls: list[list[str]] = field(default_factory=list)  # [name, arguments] per call
    reasoning_tokens: int = 0
    _header: list[int] = field(default_factory=list)
    _body: IncrementalText | None = None
    _kind: str = ""  # the open body's: reasoning | content | arguments
    _sent: int = 0  # characters of the open body given out

    def __post_init__(self):
        raw = self.tokenizer.raw
        self._ends = {raw.token_to_id(t) for t in _ENDS} - {None}
        self._message = raw.token_to_id("<|message|>")
        self._headers = {raw.token_to_id(t) for t in _HEADERS} - {None}

    def feed(self, token: int) -> list[Piece]:
        """The pieces one more token adds."""
        if self._body is None:
            return self._header_token(token)
        if token in self._ends:
            return self._close()
        if token in self._headers:  # a header begins without the body's end: the body ends here
            return [*self._close(), *self._header_token(token)]
        if self._kind == "reasoning":
            self.reasoning_tokens += 1
        return self._more(self._body.add(token))

    def finish(self) -> list[Piece]:
        """What the end of the answer releases: the open body closed; a header that never opened a body is dropped
        where it holds harmony's markers (cut by max_tokens), else it is text the model wrote, as content."""
        if self._body is not None:
            return self._close()
        header, self._header = self._header, []
        if any(token in self._headers for token in header):
            return []
        text = self.tokenizer.decode(header)
        return self._add("content", text) if text.strip() else []

    def _header_token(self, token: int) -> list[Piece]:
        if token != self._message:
            self._header.append(token)
            text = self.tokenizer.decode(self._header, keep_special=True)
            if len(text) <= HEADER_CHARS or _CHANNEL.search(text):
                return []
            tokens, self._header = self._header, []  # not a header: text the model writes, as content
            self._open("content")
            for earlier in tokens:
                text = self._body.add(earlier)
            return self._more(text)
        header = self.tokenizer.decode(self._header, keep_special=True)
        self._header = []
        recipient, channel = _RECIPIENT.search(header), _CHANNEL.search(header)
        if recipient and recipient.group(1).startswith("functions."):
            self.calls.append([recipient.group(1).removeprefix("functions."), ""])
            self._open("arguments")
            return [Piece("call", self.calls[-1][0], len(self.calls) - 1)]
        self._open("reasoning" if channel and channel.group(1) == "analysis" else "content")
        return []

    def _open(self, kind: str) -> None:
        self._body, self._kind, self._sent = IncrementalText(self.tokenizer), kind, 0

    def _close(self) -> list[Piece]:
        ended = [Piece("end", index=len(self.calls) - 1)] if self._kind == "arguments" else []
        self._body = None
        return ended

    def _more(self, text: str) -> list[Piece]:
        new, self._sent = text[self._sent :], len(text)
        return self._add(self._kind, new) if new else []

    def _add(self, kind: str, text: str) -> list[Piece]:
        if kind == "reasoning":
            self.reasoning += text
        elif kind == "content":
            self.content += text
        else:
            self.calls[-1][1] += text
            return [Piece("arguments", text, len(self.calls) - 1)]
        return [Piece(kind, text)]


def read_harmony(tokenizer: Tokenizer, token_ids: list[int]) -> HarmonyReader:
    """A finished answer read whole."""
    reader = HarmonyReader(tokenizer)
    for token in token_ids:
        reader.feed(token)
    reader.finish()
    return reader


class HarmonyStream:
    """One choice's harmony answer as a chat stream's news: (reasoning, content, call pieces) per token, the call
    pieces as tools.ToolStream sends them (the first with the call's id, type and name, then its arguments). A call is
    a tool call where the request takes calls (tools, tool_choice not none) and names one of its functions; any other
    is content, as `functions.NAME ` and its arguments. Under auto (no grammar: the model's channels decide) a call
    is held until its body ends and stands only where it is valid (ToolRequest.stands; a call cut by max_tokens stays
    a call), else it is content as well. `taken` holds the calls as [name, arguments], in order."""

    def __init__(self, tokenizer: Tokenizer, request: ToolRequest | None = None, choice: int = 0):
        self.reader, self.request, self.choice = HarmonyReader(tokenizer), request, choice
        takes = request is not None and request.choice != "none"
        self.declared = {f.name for f in request.functions} if takes else set()
        self.judged = takes and request.choice == "auto"
        self.taken: list[list[str]] = []
        self.content = ""  # read_answer's: the whole answer's content
        self._index: dict[int, int] = {}  # the reader's call index -> its index among the taken calls
        self._held: dict[int, list[str]] = {}  # the reader's call index -> [name, arguments] to be judged (auto)

    @property
    def calls(self) -> int:
        return len(self.taken)

    def feed(self, token: int) -> tuple[str, str, list]:
        return self._news(self.reader.feed(token))

    def finish(self, cut: bool = False) -> tuple[str, str, list]:
        return self._news(self.reader.finish(), cut=cut)

    def _news(self, pieces: list[Piece], cut: bool | None = None) -> tuple[str, str, list]:
        """`cut`: None while the answer goes on; at its end, whether max_tokens cut it."""
        reasoning, content, calls = "", "", []
        for piece in pieces:
            if piece.kind == "reasoning":
                reasoning += piece.text
            elif piece.kind == "call" and piece.text in self.declared and self.judged:
                self._held[piece.index] = [piece.text, ""]
            elif piece.kind in ("arguments", "end") and piece.index in self._held:
                if piece.kind == "arguments":
                    self._held[piece.index][1] += piece.text
                    continue
                text, taken = self._judge(piece.index, cut=bool(cut))
                content, calls = content + text, calls + taken
            elif piece.kind == "content" or (piece.kind == "arguments" and piece.index not in self._index):
                content += piece.text
            elif piece.kind == "call" and piece.text not in self.declared:  # not a call the request takes: text
                content += f"functions.{piece.text} "
            elif piece.kind == "call":
                calls += self._take(piece.index, piece.text, "")
            elif piece.kind == "arguments":
                from .protocol import DeltaFunction, DeltaToolCall  # the wire's types: only a stream needs them

                index = self._index[piece.index]
                self.taken[index][1] += piece.text
                calls.append(DeltaToolCall(index=index, function=DeltaFunction(arguments=piece.text)))
        for index in list(self._held) if cut is not None else []:  # the answer ended inside a held call's body
            text, taken = self._judge(index, cut=cut)
            content, calls = content + text, calls + taken
        return reasoning, content, calls

    def _judge(self, index: int, cut: bool) -> tuple[str, list]:
        """A held call, its body ended: (content, call pieces)."""
        name, arguments = self._held.pop(index)
        if not cut and not self.request.stands(name, arguments):
            return f"functions.{name} {arguments}", []
        return "", self._take(index, name, arguments)

    def _take(self, index: int, name: str, arguments: str) -> list:
        """A call taken: its first piece (id, type, name), and its arguments as far as they are known."""
        from .protocol import DeltaFunction, DeltaToolCall

        position = self._index[index] = len(self.taken)
        self.taken.append([name, arguments])
        function = DeltaFunction(name=name, arguments="")
        pieces = [DeltaToolCall(index=position, id=self.request.call_id(position, self.choice), type="function",
                                function=function)]  # fmt: skip
        return pieces + (
            [DeltaToolCall(index=position, function=DeltaFunction(arguments=arguments))] if arguments else []
        )


def read_answer(
    tokenizer: Tokenizer, token_ids: list[int], request: ToolRequest | None = None, choice: int = 0, cut: bool = False
) -> HarmonyStream:
    """A finished answer read whole: the stream's `taken` calls, its reader's reasoning and content (what was not
    taken as a call included). `cut`: max_tokens cut the answer."""
    stream = HarmonyStream(tokenizer, request, choice)
    content = ""
    for token in token_ids:
        content += stream.feed(token)[1]
    content += stream.finish(cut=cut)[1]
    stream.content = content
    return stream
