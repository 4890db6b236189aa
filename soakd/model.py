"""Data model: the one thing that flows (RequestSpec in, Outcome out).

Every instant is monotonic nanoseconds (``time.perf_counter_ns``, which is
CLOCK_MONOTONIC on Linux, the same clock asyncio's loop uses). Wall-clock time
appears once per outcome (``wall_start``), only to stamp stored rows.
"""

from __future__ import annotations

import enum
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    from soakd.shapes import LoadShape  # its own module: one class per mode

from soakd.units import NS_PER_S as NS_PER_S  # the clock's units, one home (units.py)
from soakd.units import S_PER_NS as S_PER_NS

FAILING_CAUSES: Final = (
    "connect_refused",
    "connect_error",
    "timeout_connect",
    "http_auth",
    "http_404",
)
"""What a failing target failed with (soakd/workload/failing.py decides which): a bounded
set, safe as a metric label."""


class ErrorKind(enum.StrEnum):
    """How a request failed. Bounded set: safe as a metric label."""

    TIMEOUT_CONNECT = "timeout_connect"
    TIMEOUT_TTFT = "timeout_ttft"
    TIMEOUT_IDLE = "timeout_idle"  # the stream went silent after its first token
    TIMEOUT_TOTAL = "timeout_total"
    CONNECT_REFUSED = "connect_refused"
    CONNECT_ERROR = "connect_error"  # DNS, unreachable, TLS handshake, proxy refused
    HTTP_AUTH = "http_auth"  # 401 / 403: a key problem, not the target's health
    HTTP_429 = "http_429"
    HTTP_4XX = "http_4xx"
    HTTP_5XX = "http_5xx"
    STREAM_TRUNCATED = "stream_truncated"  # connection ended before the stream finished
    BAD_CHUNK = "bad_chunk"  # an SSE event that is not valid JSON / UTF-8
    BAD_RESPONSE = "bad_response"  # 200 with an error body, wrong content type, no choices
    TOO_LARGE = "too_large"  # a line or body over soakd's limits
    CANCELLED = "cancelled"  # soakd stopped while the request was in flight
    CLIENT_ERROR = "client_error"  # anything else raised inside soakd's client
    # The sender process holding it died (run.workers > 1): the server may or may not have
    # answered; recorded once, never sent again.
    WORKER_LOST = "worker_lost"
    # Refused by the guard in front of the server (soakd gateway), by its error code: load
    # it shed on purpose, not a failure of the server behind it.
    SHED_VRAM_BREAKER = "shed_vram_breaker"  # 429 vram_breaker_open
    SHED_ERROR_BREAKER = "shed_error_breaker"  # 503 error_breaker_open
    SHED_QUEUE_FULL = "shed_queue_full"  # 429 queue_full
    SHED_QUEUE_TIMEOUT = "shed_queue_timeout"  # 503 queue_timeout
    # HTTP itself broken: a status line, a header or the body's framing (a chunk size) that
    # the HTTP parser rejects, or a body longer than its Content-Length
    PROTOCOL_ERROR = "protocol_error"
    # more content chunks than targets[].max_output_factor x max_tokens: cut there
    TOO_MANY_TOKENS = "too_many_tokens"
    # Lost with no answer on a connection reused after an answer the server closes its
    # connections after, unannounced (soakd/targets/pool.py): it most likely never read it.
    CONNECTION_CLOSED_UNANNOUNCED = "connection_closed_unannounced"

    @property
    def shed(self) -> bool:
        """The guard's own refusal (origin: gateway), not the server's failure."""
        return self in SHED_KINDS


SHED_KINDS: Final = frozenset(
    {
        ErrorKind.SHED_VRAM_BREAKER,
        ErrorKind.SHED_ERROR_BREAKER,
        ErrorKind.SHED_QUEUE_FULL,
        ErrorKind.SHED_QUEUE_TIMEOUT,
    }
)
"""The guard gateway's own refusals: the one place a kind is decided to be a shed. An
outcome label read back as a string (the journal, a fold) is tested with ``in`` too."""


class MissReason(enum.StrEnum):
    """Why a planned send was not made (soakd/workload/ledger.py). Bounded: a metric label."""

    LATE = "late"  # its instant was more than max_lateness past
    IN_FLIGHT_CAP = "in_flight_cap"  # max_in_flight requests were out
    SPEND_CAP = "spend_cap"  # paused: a spend cap (soakd/workload/guard.py)
    RATE_LIMITED = "rate_limited"  # paused: honouring a Retry-After
    NO_WORKER = "no_worker"  # run.workers > 1 and every sender process was down
    FAILING = "failing"  # the target failed every request: paused (soakd/workload/failing.py)
    INVALID_REQUEST = "invalid_request"  # the client refused to build it (never written)


class PauseReason(enum.StrEnum):
    """Why a target's sends are paused (soakd/workload/guard.py); an open-loop send not made
    meanwhile is counted under the ``MissReason`` of the same name."""

    SPEND_CAP = "spend_cap"
    RATE_LIMITED = "rate_limited"
    FAILING = "failing"

    @property
    def missed(self) -> MissReason:
        return MissReason(self.value)


class SpendCap(enum.StrEnum):
    """A target's spend caps (``targets[].spend``: ``max_`` and the cap's name)."""

    REQUESTS_PER_HOUR = "requests_per_hour"
    TOKENS_PER_HOUR = "tokens_per_hour"
    REQUESTS = "requests"
    TOKENS = "tokens"


SHED_BY_CODE = {
    "vram_breaker_open": ErrorKind.SHED_VRAM_BREAKER,
    "error_breaker_open": ErrorKind.SHED_ERROR_BREAKER,
    "queue_full": ErrorKind.SHED_QUEUE_FULL,
    "queue_timeout": ErrorKind.SHED_QUEUE_TIMEOUT,
}
"""The guard gateway's OpenAI-shaped error ``code`` -> the kind it is counted under."""

USAGE_REJECTED_REASONS: Final = ("not_integer", "negative", "implausible")
"""Why a server's ``usage`` was not taken (``Outcome.usage_rejected``), a bounded label:
a count that is not a JSON integer (a float, a string, a bool; or usage not an object), a
negative one, or one above what the answer could hold (``soakd.targets.stream``)."""
GATEWAY_ORIGIN_HEADER = "X-Soakd-Origin"
"""Set to ``gateway`` on every answer ``soakd gateway`` writes itself: only those answers are
the guard's own refusals (a cloud's 503 with a look-alike code is the cloud's)."""


OK = "ok"
"""The outcome label of a successful request."""


def status_class(status: int) -> str:
    """``"2xx"`` ... ``"5xx"``, or ``"none"`` when no response arrived."""
    return f"{status // 100}xx" if 100 <= status <= 599 else "none"


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """A planned request. ``seq`` is the index in the shared prompt sequence,
    so every target receives the same prompts in the same order (fair A/B)."""

    target: str
    phase: str
    seq: int
    # the text given outright (the preflight's probe); "": the sending process's builder
    # makes it from seq, conversation and turn (soakd/workload/build.py)
    prompt: str
    prompt_tokens_hint: int  # the planned length; the server's usage count wins
    max_tokens: int
    temperature: float
    scheduled_ns: int  # when the schedule said to send it (monotonic)
    deadline_ns: int = 0
    """The last instant it may still be sent (0: any). An open-loop send is due by its
    instant plus ``max_lateness``; the sender that reaches it later does not send it and
    raises ``NotSent(late)``: a worker process behind its own loop drops its backlog by
    the same rule as the runner."""
    output_planned: bool = False
    """``max_tokens`` is the answer's planned length (soakd/workload/answers.py), to be
    served whole where the target is asked to (``targets[].planned_output``); False: it is
    ``workload.max_tokens``, a cap the answer may stop short of."""
    conversation: int = -1
    """The conversation this request is a turn of (-1: none, a single request)."""
    turn: int = 0
    """Its turn in that conversation, from 0."""
    keep_answer: bool = False
    """Keep the answer's text on the Outcome (``Outcome.answer``): a conversation's next
    turn holds it, a check judges it. Off for every other request: soakd keeps no text.
    Kept at temperature 0, it is also asked with a ``seed`` (``seed``)."""
    history: tuple[str, ...] = ()
    """A conversation's turn: the answers its server gave to the earlier turns, in order
    ("" where none arrived); the sender's builder puts them between the user turns."""

    @property
    def seed(self) -> int | None:
        """The body's ``seed``: ANSWER_SEED for an answer kept at temperature 0 (a check's,
        to be the same each time); None: none sent."""
        return ANSWER_SEED if self.keep_answer and self.temperature == 0 else None


ANSWER_SEED: Final = 0
"""The ``seed`` of a request that keeps its answer at temperature 0 (a check's): the same
answer each time where the server honours it (``targets[].extra_body`` may override it)."""


@dataclass(slots=True)
class Outcome:
    """What one request became. Filled by the target client while the request
    runs, then handed to every reader. Never holds a response body."""

    target: str
    phase: str
    seq: int
    scheduled_ns: int
    sent_ns: int = 0
    wall_start: float = 0.0  # time.time() at send, for stamping rows only
    first_byte_ns: int | None = None
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    end_ns: int = 0
    status: int = 0
    error: ErrorKind | None = None
    error_detail: str = ""  # short, secret-free, for logs only (never a label)
    oom: bool = False  # the error body said the device ran out of memory
    prompt_tokens: int | None = None
    # the server's usage when taken, else the content chunks streamed; None: unknown (a
    # non-streamed answer with text whose usage was absent or not taken: one body is no
    # count, and soakd never guesses one)
    output_tokens: int | None = 0
    usage_reported: bool = False  # output_tokens came from the server's usage
    content_chunks: int = 0  # content chunks received: the streamed count
    # the server's usage was there and not taken (a USAGE_REJECTED_REASONS entry; "": none):
    # output_tokens is then the streamed count (None, unknown, for a non-streamed answer)
    usage_rejected: str = ""
    # a streamed answer whose usage was taken: usage's completion tokens minus the content
    # chunks streamed (None: not a stream, or no usage taken)
    usage_delta: int | None = None
    itl_ns: array[int] = field(default_factory=lambda: array("q"))
    retry_after_s: float | None = None  # a 429/503's Retry-After (or retry-after-ms), seconds
    retry_after_unreadable: bool = False  # it had one soakd could not read: the default pause
    # the ITL gaps' Digest buckets (key -> count): computed once, by the worker process that
    # timed the request or by the first reader (soakd.measure.analysis.itl_keys), read by every
    # other
    itl_keys: dict[int, int] | None = None
    conversation: int = -1  # the spec's: the conversation it is a turn of (-1: none)
    turn: int = 0  # the spec's: its turn in that conversation
    # the answer's text as the server gave it, kept only when the spec asked
    # (``RequestSpec.keep_answer``): whatever arrived, even of a failed request; None: not
    # kept. Never journaled, logged or exported: an answer may hold anything
    answer: str | None = field(default=None, repr=False)
    # with a kept answer: the ``model`` and ``system_fingerprint`` its first chunk (or its
    # body) carried ("": none), what the checks watch for a model changed under its name
    identity: tuple[str, str] | None = field(default=None, repr=False)
    # the record this outcome came in from a sender worker (soakd/outcome_record.py), its
    # instants already on soakd's clock: the journal copies it into its packet as it is.
    # While it is set, soakd's own copy lacks the ITL gaps and buckets (nothing in soakd's
    # process reads them: the journal's writer does, from the record). None: built here.
    packed: bytes | None = field(default=None, repr=False, compare=False)

    @classmethod
    def planned(cls, spec: RequestSpec) -> Outcome:
        """An empty Outcome for ``spec``, filled in place by the target while it runs."""
        if spec.conversation < 0:
            return cls(spec.target, spec.phase, spec.seq, spec.scheduled_ns)
        return cls(
            spec.target,
            spec.phase,
            spec.seq,
            spec.scheduled_ns,
            conversation=spec.conversation,
            turn=spec.turn,
        )

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def outcome(self) -> str:
        """``"ok"`` or the error kind: the value of the ``outcome`` label."""
        return OK if self.error is None else self.error.value

    @property
    def usage_mismatch(self) -> bool:
        """The server's usage, taken, differs from the content chunks streamed by more than
        one (a server that sends several tokens a chunk differs legitimately)."""
        delta = self.usage_delta
        return delta is not None and not -1 <= delta <= 1

    @property
    def dispatch_lag_ns(self) -> int:
        """Actual minus scheduled send time: the generator's own backlog."""
        return max(0, self.sent_ns - self.scheduled_ns)

    @property
    def ttft_ns(self) -> int | None:
        """Send to first content token (not the role-only chunk)."""
        return None if self.first_token_ns is None else self.first_token_ns - self.sent_ns

    @property
    def e2e_ns(self) -> int:
        return self.end_ns - self.sent_ns

    @property
    def tpot_ns(self) -> int | None:
        """(E2E - TTFT) / (output tokens - 1), as vLLM's benchmark defines it (None: no
        first token, fewer than two tokens, or their count unknown)."""
        ttft = self.ttft_ns
        n = self.output_tokens
        if ttft is None or n is None or n < 2:
            return None
        return (self.e2e_ns - ttft) // (n - 1)


class Finished(Protocol):
    """A finished request as the outcome sinks read it (``soakd.types.OutcomeSink``):
    read-only, and without the ITL gaps, their buckets or the record.

    One shape whatever sent it: a request a sender worker timed (``run.workers`` > 1)
    comes back with its gaps in its record (``Outcome.packed``) and none in ``itl_ns``,
    one soakd timed itself has them in ``itl_ns``. Only the journal reads them (it is the
    runner's ``OutcomeRecorder``, given the whole ``Outcome``); a sink sees neither, so it
    reads the same fields with workers or without. An ``Outcome`` is a ``Finished``: the
    view is a type, not a copy (nothing per request)."""

    @property
    def target(self) -> str: ...
    @property
    def phase(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def scheduled_ns(self) -> int: ...
    @property
    def sent_ns(self) -> int: ...
    @property
    def wall_start(self) -> float: ...
    @property
    def first_byte_ns(self) -> int | None: ...
    @property
    def first_token_ns(self) -> int | None: ...
    @property
    def last_token_ns(self) -> int | None: ...
    @property
    def end_ns(self) -> int: ...
    @property
    def status(self) -> int: ...
    @property
    def error(self) -> ErrorKind | None: ...
    @property
    def error_detail(self) -> str: ...
    @property
    def oom(self) -> bool: ...
    @property
    def prompt_tokens(self) -> int | None: ...
    @property
    def output_tokens(self) -> int | None: ...
    @property
    def usage_reported(self) -> bool: ...
    @property
    def content_chunks(self) -> int: ...
    @property
    def usage_rejected(self) -> str: ...
    @property
    def usage_delta(self) -> int | None: ...
    @property
    def retry_after_s(self) -> float | None: ...
    @property
    def retry_after_unreadable(self) -> bool: ...
    @property
    def conversation(self) -> int: ...
    @property
    def turn(self) -> int: ...
    @property
    def ok(self) -> bool: ...
    @property
    def outcome(self) -> str: ...
    @property
    def usage_mismatch(self) -> bool: ...
    @property
    def dispatch_lag_ns(self) -> int: ...
    @property
    def ttft_ns(self) -> int | None: ...
    @property
    def e2e_ns(self) -> int: ...
    @property
    def tpot_ns(self) -> int | None: ...
    @property
    def answer(self) -> str | None: ...
    @property
    def identity(self) -> tuple[str, str] | None: ...


@dataclass(frozen=True, slots=True)
class Phase:
    """A phase of the plan, at offsets from the plan's start (monotonic ns)."""

    index: int
    name: str
    start_ns: int
    end_ns: int
    loads: dict[str, LoadShape]  # by target name

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True, slots=True)
class Plan:
    """The whole schedule, resolved: phases back to back on one monotonic axis."""

    phases: tuple[Phase, ...]
    scale: float = 1.0  # real time per configured time: < 1 when rehearsing

    @property
    def duration_ns(self) -> int:
        return self.phases[-1].end_ns if self.phases else 0

    def phase_at(self, offset_ns: int) -> Phase | None:
        for phase in self.phases:
            if phase.start_ns <= offset_ns < phase.end_ns:
                return phase
        return None


@dataclass(frozen=True, slots=True)
class Sample:
    """One probe reading (GPU, server /metrics, health), for the journal and the report.

    ``name`` is the soakd metric name it was exported under; ``labels`` its bounded
    label values (gpu index, target...), as a sorted tuple of pairs."""

    wall: float  # time.time() of the reading
    name: str
    value: float
    labels: tuple[tuple[str, str], ...] = ()
