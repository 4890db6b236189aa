"""Targets room, tokenize: a target's own token count of a text, from its ``/tokenize``.

Two shapes, tried in this order and then kept: vLLM's (``POST /tokenize`` with
``{"model", "prompt" | "messages"}`` -> ``{"count", "tokens", "token_strs"}``) and
llama.cpp's (``{"content"}`` -> ``{"tokens"}``, a chat prompt first through its
``/apply-template``). Both live at the server's root, beside ``/v1``. These requests are
not measured: no outcome, no counter; the server's own request counters may see them.
"""

from __future__ import annotations

import json
from typing import Any, Final, Literal

import aiohttp
from aiohttp import BasicAuth, ClientSession, ClientTimeout, DummyCookieJar
from yarl import URL

from soakd.config import TargetConfig
from soakd.net import env_proxy, header_problem
from soakd.targets.headers import target_headers
from soakd.workload.calibration import Tokenized, TokenizeError

__all__ = ["BODY_LIMIT", "ServerTokenizer", "open_tokenizer"]

BODY_LIMIT: Final = 8 << 20
"""Largest /tokenize answer read (1,024 words with their token strings: ~40 kB)."""

Dialect = Literal["vllm", "llamacpp"]


class _Refused(Exception):
    """The server answered, but not in this dialect (an HTTP error, another shape)."""


class ServerTokenizer:
    """Counts as one target does, through its /tokenize. Build it with ``open_tokenizer``;
    ``aclose`` closes its session."""

    def __init__(
        self,
        cfg: TargetConfig,
        session: ClientSession,
        root: str,
        *,
        timeout_s: float,
        proxy: URL | None = None,
        proxy_auth: BasicAuth | None = None,
    ) -> None:
        self.name = cfg.name
        self.dialect: Dialect | None = None  # known after the first answer
        self.requests = 0
        self._session = session
        self._root = root
        self._chat = cfg.api == "chat"
        self._model = cfg.model
        self._timeout = ClientTimeout(total=timeout_s)
        self._proxy = proxy
        self._proxy_auth = proxy_auth
        # a TLS context costs 20-100 ms to build: only for an https server
        self._ssl = cfg.ssl_context() if root.startswith("https:") else True

    async def aclose(self) -> None:
        await self._session.close()

    async def tokenize(self, text: str, *, as_sent: bool) -> Tokenized:
        """The target's count of ``text`` (TokenizeError: why there is none)."""
        first: _Refused | None = None
        if self.dialect in (None, "vllm"):
            try:
                out = await self._vllm(text, as_sent)
            except _Refused as exc:
                if self.dialect == "vllm":
                    raise TokenizeError(f"/tokenize: {exc}") from None
                first = exc
            else:
                self.dialect = "vllm"
                return out
        try:
            out = await self._llamacpp(text, as_sent)
        except _Refused as exc:
            said = f"{first} (vLLM's shape), {exc} (llama.cpp's)" if first else str(exc)
            raise TokenizeError(f"/tokenize: {said}") from None
        self.dialect = "llamacpp"
        return out

    async def _vllm(self, text: str, as_sent: bool) -> Tokenized:
        body: dict[str, Any] = {"model": self._model}
        if not as_sent:
            body |= {"prompt": text, "add_special_tokens": False, "return_token_strs": True}
        elif self._chat:  # the template and its specials, as /v1/chat/completions applies them
            body |= {"messages": [_message(text)], "add_generation_prompt": True}
        else:  # /v1/completions adds the BOS
            body |= {"prompt": text, "add_special_tokens": True}
        doc = await self._post("/tokenize", body)
        count, tokens, strs = doc.get("count"), doc.get("tokens"), doc.get("token_strs")
        if type(count) is not int or count < 0 or not isinstance(tokens, list):
            raise _Refused("no count in the answer")
        if isinstance(strs, list) and len(strs) == count and all(isinstance(s, str) for s in strs):
            return Tokenized(count, strs)
        return Tokenized(count)

    async def _llamacpp(self, text: str, as_sent: bool) -> Tokenized:
        if not as_sent:
            body: dict[str, Any] = {"content": text, "add_special": False, "with_pieces": True}
        elif self._chat:  # llama-server's chat path: its template, then BOS and specials
            doc = await self._post("/apply-template", {"messages": [_message(text)]})
            prompt = doc.get("prompt")
            if not isinstance(prompt, str):
                raise _Refused("no prompt from /apply-template")
            body = {"content": prompt, "add_special": True, "parse_special": True}
        else:
            body = {"content": text, "add_special": True}
        doc = await self._post("/tokenize", body)
        tokens = doc.get("tokens")
        if not isinstance(tokens, list):
            raise _Refused("no tokens in the answer")
        pieces = [_piece(t) for t in tokens]
        if None in pieces or as_sent:
            return Tokenized(len(tokens))
        return Tokenized(len(tokens), [p for p in pieces if p is not None])

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One POST; _Refused for an answer in another dialect, TokenizeError when there is
        no answer at all (no second dialect is tried then)."""
        self.requests += 1
        try:
            async with self._session.post(
                self._root + path,
                data=json.dumps(body),
                timeout=self._timeout,
                ssl=self._ssl,
                proxy=self._proxy,
                proxy_auth=self._proxy_auth,
                allow_redirects=False,
            ) as resp:
                raw = await resp.content.read(BODY_LIMIT + 1)
                if resp.status != 200:
                    raise _Refused(f"HTTP {resp.status}")
        except TimeoutError:
            raise TokenizeError(f"{path}: timed out") from None
        except aiohttp.ClientConnectorError:
            raise TokenizeError(f"{path}: cannot connect") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise TokenizeError(f"{path}: {type(exc).__name__}") from None
        except ValueError as exc:  # the request could not be built (a header aiohttp refuses)
            raise TokenizeError(f"{path}: not sent ({type(exc).__name__})") from None
        if len(raw) > BODY_LIMIT:
            raise _Refused(f"answer over {BODY_LIMIT} bytes")
        try:
            doc = json.loads(raw)
        except ValueError:  # not JSON, not UTF-8
            raise _Refused("not JSON") from None
        if not isinstance(doc, dict):
            raise _Refused("not a JSON object")
        return doc


def _message(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _piece(token: object) -> str | None:
    """A llama.cpp token with its piece: the text, or its bytes (a partial character)."""
    if not isinstance(token, dict):
        return None
    piece = token.get("piece")
    if isinstance(piece, str):
        return piece
    if isinstance(piece, list) and all(type(b) is int and 0 <= b < 256 for b in piece):
        return bytes(piece).decode("latin-1")
    return None


async def open_tokenizer(cfg: TargetConfig, base_url: str, timeout_s: float) -> ServerTokenizer:
    """A counter for one target at ``base_url`` (its server's, not a gateway's), with the
    target's key, headers, TLS and proxy, as its client has them. TokenizeError for a
    target that has no /tokenize to ask (Azure)."""
    if cfg.kind == "azure":
        raise TokenizeError("Azure has no /tokenize")
    root = base_url.rstrip("/").removesuffix("/v1")
    proxy, proxy_auth = (URL(cfg.proxy), None) if cfg.proxy is not None else await env_proxy(root)
    headers = target_headers(cfg, cfg.api_key())
    if any(header_problem(k, v) for k, v in headers.items()):  # as the target's client
        raise TokenizeError("a header cannot go on the wire: not asked")
    session = ClientSession(headers=headers, trust_env=False, cookie_jar=DummyCookieJar())
    return ServerTokenizer(
        cfg, session, root, timeout_s=timeout_s, proxy=proxy, proxy_auth=proxy_auth
    )
