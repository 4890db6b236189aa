"""Simulator room, wire: vLLM's OpenAI-compatible request and response formats, pure.

What a request asks for (``parse``: the checks and the error bodies vLLM answers with) and
what the answers look like byte for byte (``Frames`` for SSE chunks, ``completion_body``
for a whole response). No IO, no clock: ``server.py`` does the serving.

Prompt length is the number of whitespace-separated words of the prompt (chat:
the message contents joined): a stand-in for a tokenizer, close enough for
English prose (real tokenizers give ~1.3 tokens a word) and exactly predictable.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web

from soakd.checks import builtin
from soakd.profiles import Profile

# Output text: short words, one a token, each with its leading space (as BPE tokens).
# fmt: off
VOCAB: Final = (
    " the", " a", " of", " and", " to", " in", " is", " it", " on", " as", " at", " by", " we",
    " be", " or", " an", " so", " up", " no", " go", " do", " if", " me", " my", " he", " us",
    " new", " old", " red", " sun", " sea", " day", " way", " key", " log", " map", " run",
    " set", " top", " end", " box", " cat", " dog", " fox", " owl", " gpu", " kv", " batch",
    " token", " cache", " queue", " soak", " test", " load", " time", " heat", " fan", " disk",
    " node", " edge", " card", " byte", " word", " line",
)
# fmt: on
VOCAB_JSON: Final = tuple(json.dumps(w) for w in VOCAB)
VOCAB_SIZE: Final = 32000  # the ids /tokenize makes up range over this many
SSE_CONTENT_TYPE: Final = "text/event-stream; charset=utf-8"
DONE: Final = b"data: [DONE]\n\n"


def word(seq_id: int, i: int) -> int:
    """Index of the i-th token's word: varied, reproducible, no state kept."""
    return (seq_id * 17 + i * 5) % len(VOCAB)


class ApiError(Exception):
    """A request vLLM would refuse, with the status and the body it would send."""

    def __init__(self, status: int, err_type: str, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.err_type = err_type
        self.message = message
        self.param = param

    def response(self) -> web.Response:
        return error_response(self.status, self.err_type, self.message, self.param)


def error_body(status: int, err_type: str, message: str, param: str | None = None) -> str:
    """vLLM's ErrorResponse: ``{"error": {"message", "type", "param", "code"}}``."""
    info = {"message": message, "type": err_type, "param": param, "code": status}
    return json.dumps({"error": info})


def error_response(
    status: int, err_type: str, message: str, param: str | None = None
) -> web.Response:
    return web.Response(
        status=status,
        text=error_body(status, err_type, message, param),
        content_type="application/json",
    )


@dataclass(frozen=True, slots=True)
class SimRequest:
    """What the simulator needs from a completion request; the body itself is dropped."""

    chat: bool
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    ignore_eos: bool
    min_tokens: int = 0  # no EOS before this many tokens (vLLM's sampling parameter)
    answer: str | None = None  # a check's right answer (soakd/checks/builtin.py): said as is
    # temperature 0: the words follow from the prompt (the same answer each time); None:
    # from the request's own id
    words_from: int | None = None


# -- request parsing ------------------------------------------------------------------


def _count_words(text: str) -> int:
    return len(text.split())


def _chat_prompt_tokens(body: dict[str, Any]) -> int:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "BadRequestError", "messages must be a non-empty list", "messages")
    words = 0
    for msg in messages:
        if not isinstance(msg, dict):
            raise ApiError(400, "BadRequestError", "each message must be an object", "messages")
        content = msg.get("content")
        if isinstance(content, str):
            words += _count_words(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    words += _count_words(part["text"])
        elif content is not None:
            raise ApiError(400, "BadRequestError", "message content must be text", "messages")
    return max(1, words)  # a chat template always adds some tokens


def _completion_prompt_tokens(body: dict[str, Any]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return max(1, _count_words(prompt))
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return len(prompt)  # token ids
    raise ApiError(
        400, "BadRequestError", "prompt must be a string or a list of token ids", "prompt"
    )


def parse(body: object, chat: bool, profile: Profile, model: str) -> SimRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "BadRequestError", "request body must be a JSON object")
    asked_model = body.get("model")
    if asked_model is not None and asked_model != model:
        raise ApiError(404, "NotFoundError", f"The model `{asked_model}` does not exist.")
    n = body.get("n", 1)
    if n not in (1, None):
        raise ApiError(400, "BadRequestError", "the simulator serves n=1 only", "n")
    stream = body.get("stream") is True
    options = body.get("stream_options")
    if options is not None and not stream:
        raise ApiError(
            400,
            "BadRequestError",
            "Stream options can only be defined when `stream=True`.",
            "stream_options",
        )
    include_usage = isinstance(options, dict) and options.get("include_usage") is True

    prompt_tokens = _chat_prompt_tokens(body) if chat else _completion_prompt_tokens(body)
    text = _last_text(body, chat)
    answer = builtin.solve(text)
    greedy = body.get("temperature") == 0
    limit = profile.max_model_len
    if prompt_tokens >= limit:
        raise ApiError(
            400,
            "BadRequestError",
            f"This model's maximum context length is {limit} tokens. However, your prompt "
            f"contains {prompt_tokens} input tokens, which exceeds this limit even without "
            "any output tokens. Please reduce the length of the input prompt.",
            "input_tokens",
        )
    requested = body.get("max_completion_tokens") if chat else None
    if requested is None:
        requested = body.get("max_tokens")
    if requested is not None:
        if type(requested) is not int or requested < 1:
            raise ApiError(
                400, "BadRequestError", f"max_tokens must be at least 1, got {requested}.",
                "max_tokens",
            )  # fmt: skip
        if requested > limit:
            raise ApiError(
                400,
                "BadRequestError",
                f"max_tokens={requested} cannot be greater than max_model_len={limit}. "
                "Please request fewer output tokens.",
                "max_tokens",
            )
    # vLLM clamps the output to what is left of the context.
    max_tokens = min(requested or limit, limit - prompt_tokens)
    return SimRequest(
        chat=chat,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
        ignore_eos=body.get("ignore_eos") is True,
        min_tokens=min(_min_tokens(body.get("min_tokens"), requested), max_tokens),
        answer=answer,
        words_from=zlib.crc32(text.encode()) if greedy else None,
    )


def _last_text(body: dict[str, Any], chat: bool) -> str:
    """The prompt's text a check would be in: the last message's, or the prompt's."""
    if not chat:
        prompt = body.get("prompt")
        return prompt if isinstance(prompt, str) else ""
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    content = last.get("content") if isinstance(last, dict) else None
    return content if isinstance(content, str) else ""


def answer_pieces(answer: str) -> list[str]:
    """A check's answer as the tokens streamed: one a word, each after the first with its
    leading space, as BPE tokens come."""
    words = answer.split(" ")
    return [words[0], *(" " + w for w in words[1:])]


def wrong(answer: str) -> str:
    """A plausible wrong answer: a number off by one, any other text reversed."""
    return str(int(answer) + 1) if answer.isdigit() else answer[::-1]


def _min_tokens(value: object, max_tokens: int | None) -> int:
    """``min_tokens`` as vLLM's SamplingParams checks it (absent: 0)."""
    if value is None:
        return 0
    if type(value) is not int or value < 0:
        raise ApiError(
            400,
            "BadRequestError",
            f"min_tokens must be greater than or equal to 0, got {value}.",
            "min_tokens",
        )
    if max_tokens is not None and value > max_tokens:
        raise ApiError(
            400,
            "BadRequestError",
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {value}.",
            "min_tokens",
        )
    return value


def tokenize(body: object, profile: Profile, model: str) -> dict[str, Any]:
    """vLLM's ``/tokenize`` answer: ``{"prompt"}`` or ``{"messages"}`` counted as the
    completions count them (a word a token; the ids are the words' CRC-32s)."""
    if not isinstance(body, dict):
        raise ApiError(400, "BadRequestError", "request body must be a JSON object")
    asked_model = body.get("model")
    if asked_model is not None and asked_model != model:
        raise ApiError(404, "NotFoundError", f"The model `{asked_model}` does not exist.")
    if "messages" in body:
        count = _chat_prompt_tokens(body)  # checks the messages too
        words = [
            w
            for msg in body["messages"]
            for part in _texts(msg.get("content"))
            for w in part.split()
        ]
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise ApiError(400, "BadRequestError", "prompt must be a string", "prompt")
        words = prompt.split()
        count = len(words)
    ids = [zlib.crc32(w.encode()) % VOCAB_SIZE for w in words] or [0] * count
    out: dict[str, Any] = {"count": count, "max_model_len": profile.max_model_len, "tokens": ids}
    if body.get("return_token_strs") is True:
        out["token_strs"] = ["\u2581" + w for w in words] or ["\u2581"] * count
    return out


def _texts(content: object) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        parts = [p for p in content if isinstance(p, dict)]
        return [p["text"] for p in parts if isinstance(p.get("text"), str)]
    return []


# -- responses ------------------------------------------------------------------------


class Frames:
    """Pre-rendered SSE frames of one response: per token only the word changes.

    The JSON is what vLLM 0.32 writes (``model_dump_json(exclude_unset=True)``).
    """

    def __init__(
        self, chat: bool, request_id: str, created: int, model: str, fingerprint: str | None = None
    ) -> None:
        obj = "chat.completion.chunk" if chat else "text_completion"
        fields: dict[str, Any] = {"id": request_id, "object": obj, "created": created}
        fields["model"] = model
        if fingerprint is not None:  # a drift fault's (vLLM sends none)
            fields["system_fingerprint"] = fingerprint
        head = json.dumps(fields, separators=(",", ":"))[:-1]
        self.head = head
        if chat:
            self.role: bytes = (
                f'data: {head},"choices":[{{"index":0,"delta":{{"role":"assistant",'
                '"content":""},"logprobs":null,"finish_reason":null}],'
                '"prompt_token_ids":null,"prompt_text":null}\n\n'
            ).encode()
            self._pre = f'data: {head},"choices":[{{"index":0,"delta":{{"content":'
            self._open = '},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
            self._close = (
                '},"logprobs":null,"finish_reason":"',
                '","stop_reason":null,"token_ids":null}]}\n\n',
            )
        else:
            self.role = b""
            self._pre = f'data: {head},"choices":[{{"index":0,"text":'
            self._open = (
                ',"logprobs":null,"finish_reason":null,"stop_reason":null,'
                '"prompt_token_ids":null,"token_ids":null}]}\n\n'
            )
            self._close = (
                ',"logprobs":null,"finish_reason":"',
                '","stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}\n\n',
            )

    def token(self, word: int, finish: str | None) -> str:
        return self.text(VOCAB_JSON[word], finish)

    def text(self, piece: str, finish: str | None) -> str:
        """One token's frame; ``piece`` is its JSON string."""
        if finish is None:
            return self._pre + piece + self._open
        return self._pre + piece + self._close[0] + finish + self._close[1]

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        total = prompt_tokens + completion_tokens
        return (
            f'data: {self.head},"choices":[],"usage":{{"prompt_tokens":{prompt_tokens},'
            f'"total_tokens":{total},"completion_tokens":{completion_tokens}}}}}\n\n'
        ).encode()


def completion_body(
    chat: bool,
    request_id: str,
    created: int,
    model: str,
    text: str,
    finish: str,
    prompt_tokens: int,
    n: int,
) -> dict[str, Any]:
    """A whole (not streamed) answer as vLLM 0.32 writes it."""
    usage = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + n,
        "completion_tokens": n,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    if chat:
        message = {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        }
        choice: dict[str, Any] = {"index": 0, "message": message}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text}
        obj = "text_completion"
    choice |= {"logprobs": None, "finish_reason": finish, "stop_reason": None, "token_ids": None}
    body = {
        "id": request_id,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage,
        "kv_transfer_params": None,
    }
    return body
