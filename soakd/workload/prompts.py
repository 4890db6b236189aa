"""Workload, prompts: what to send. Prompt text and planned length per sequence number.

A prompt depends only on (seed, seq), never on an iterator's position, so every
target gets the same prompt for the same seq (a fair A/B) while the runner
numbers each target's requests on its own.
"""

from __future__ import annotations

import json
import math
import random
from array import array
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import replace
from itertools import accumulate
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from soakd.config import MAX_TOKENS, Prefix, TokenLength, Workload
from soakd.workload.calibration import UNCALIBRATED, Calibration
from soakd.workload.records import BadRecord, index_lines

# Common English words, each a single token both alone and after a space in
# cl100k_base, o200k_base, Llama 3 and Qwen 2.5/3 (checked with those vocabularies),
# so a prompt of n words is n prompt tokens there (most BPE tokenizers come close:
# they all learn the commonest words whole). 1024 of them: 10 bits per word.
_WORD_TEXT = """
    able about above accept account act action activity add address after again age air all
    allow almost alone along already also although always an and animal another answer any
    appear apple are area arm around art article artist as ask at attack attention author away
    baby back bad bag ball band bank bar base based bay be bear beat because bed bee been
    before beg begin being below best better between big bill bin bird bit black block blood
    blue board boat body bone book born both bounce bow box boy brain branch bread break bridge
    bright bring brush budget build building burn bury bus business but buy by cake calculate
    call called camera camp campaign can cap capital car card care case cash cat catch cause
    cell center central chain chair change character charge check child choice choose church
    circle city claim class clean clear clock close cloth cloud club coach coat coffee collect
    college color comb come common community company compare computer consider contain continue
    control cool copy corn cost could count country court cover create cross cry culture cup
    current customer cut dad dark data daughter day days dead deal death deep degree describe
    design desk detail develop development die different dig direction divide do doctor dog
    door dot down draw dream drive drop dry due each ear early earn earth ease easy eat edge
    edit education effect egg else employee end energy engine enter environment escape
    especially even event ever every example exist exit expect experience eye face fact factor
    fail fair fall family fan far farm fast fat father fee feed feel fetch field figure file
    fill film final finally find fine finger finish fire firm first fish fit five fix flag flat
    flight float floor flower fly focus fold follow food foot for force foreign forget form
    former forward found four free friend from front fruit full fun future gain game gap gas
    gate general get gift girl give glass go goal god gold good grab grass gray great green
    ground group grow growth guard guess guide gun had hair half hall hammer hand hang happy
    hard has hat have he head health heart heat held help her here hero hide high hill him his
    history hit hold hole home hook hop hope horse host hot hotel hour house how human ice idea
    if image impact important in inch include including individual information ink inside
    interest into iron is issue it item its jam jet job join joy jump just keep key kick kid
    kill kind king kit knife know knowledge known lab lake lamp land lane language large last
    late later law lay lead leader leaf learn least leave left leg legal less let letter level
    library lid lie life lift light like likely line link lip list listen little live load loan
    local lock log long look lord lose loss lot love low luck machine mad made mail main major
    make making male man manage manager many map mark market mass material matter may meal mean
    media medical meet meeting member memory men mention menu message metal method middle
    million mind mine minute miss mission mix mode model modern mom moment money month moon
    more most mother mouth move movie much music must name national natural near necessary neck
    need needle nest net network never new news next nice night no nod noise none north not
    note notice now number nut object odd of off offer office official often oil old on once
    one only open operation option or orange order organization other others our out oven over
    own owner pack page paint pair pan paper parent park part party pass past path patient
    pattern pay peace peak pen people per perform period person personal pet phone physical
    pick picture pie piece pig pin pink pipe place plan plane plant plate play player plot plus
    point pole policy pool pop popular population port position possible post pot pour power
    practice pray pressure pretty price print private probably problem process produce product
    program project protect prove public pull pure push quality question quick quiet race radio
    rail rain raise range rank rate raw reach read ready real really rear reason receive recent
    record red reduce reflect region relationship release remember remove rent repeat report
    represent require research respond rest result return rib rice rich ride right ring rise
    river road rob rock rod role roll roof room root rose round row rub rule run sad safe sale
    salt same save say scene school score screen sea search season seat second section security
    see seed seek self sell send series serve service set shake shape share she shine ship
    shirt shoot shop short shot show side sign similar simple since sing single sit site six
    size ski skill skin sky sleep slide slow small so soap social sock soft sole solution solve
    some sometimes son song soon sort sound source space special speed spell spin sport spot
    spring spy square staff stage stamp stand standard star start state station stay step stick
    still stock stone stop store story strategy street string strong structure student study
    style subject success such suggest sum sun support sure surface system table tag tail take
    talk tap task tax tea teacher team technology ten tent term test text than thank that the
    their them then there these they thin thing think this though thought thread three through
    throw thumb thus ticket tie time tiny tip to today ton tone too tool top total touch tour
    town trace trade train training travel tree trial trip true trust truth try turn two type
    under unit unless until up upon us use used user usually value van very via view voice vote
    wait walk wall want war warm was wash watch water wave way we weak wear weather web week
    weight well went were west western what whatever wheel when where whether which while white
    who whole wide wife wild will win wind window wine wing wire wise wish with within without
    woman women wood word work worker world worm would wrap write writer wrong yard year years
    yellow yes yet you your zero zip zone"""
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())
assert len(WORDS) == 1024

_M64 = (1 << 64) - 1
_POOL = 1 << 16  # distinct body start positions
_HEAD_WORDS = 4  # 40 bits: a distinct opening for every seq below 2**40
_HEAD_MASK = (1 << 40) - 1
_HEAD_MULT = 0x5DEECE66D  # odd, so seq -> seq * mult + key is a bijection mod 2**40
CHARS_PER_TOKEN = 4  # the usual estimate for English text, for file prompts
_PREFIX_SALT = 0x707265666978  # "prefix": the shared prefixes' draws, apart from the rest


class Lengths(Protocol):
    """A distribution of prompt or answer lengths, as configured (``TokenLength``) or as a
    journal stored it (``StoredTokenLength``)."""

    @property
    def dist(self) -> str: ...
    @property
    def mean(self) -> int: ...
    @property
    def stddev(self) -> float: ...
    @property
    def min(self) -> int: ...
    @property
    def max(self) -> int: ...


def fixed_length(d: Lengths) -> int:
    """A fixed length's prompts: the mean, clamped to min..max as every length is."""
    return min(d.max, max(d.min, d.mean))


def describe_lengths(d: Lengths) -> str:
    """Planned prompt or answer lengths in words ("uniform 64-512", "normal 300 ± 50
    (1-4096)", "fixed 256"): the one wording of ``soakd check`` and the report's "What was
    tested"."""
    if d.dist == "uniform":
        return f"uniform {d.min}-{d.max}"
    if d.dist == "normal":
        return f"normal {d.mean} ± {d.stddev:g} ({d.min}-{d.max})"
    return f"fixed {fixed_length(d)}"


class PromptSource(Protocol):
    """Gives the prompt for a sequence number. Deterministic: same seq, same answer."""

    def spec_fields(self, seq: int) -> tuple[str, int]:
        """(prompt text, planned prompt tokens) for ``seq``."""
        ...

    def length(self, seq: int) -> int:
        """The planned prompt tokens of ``seq``, its text not built (the planner's view)."""
        ...


@runtime_checkable
class Records(Protocol):
    """A source whose prompts are a file's records (a prompt file, a dataset): seq ``s``
    sends record ``record_of(s)``, which ``label`` names in its file; a record may plan its
    answer's length (``output_tokens``; ``plans_outputs``: some record does)."""

    plans_outputs: bool

    def __len__(self) -> int: ...
    def spec_fields(self, seq: int) -> tuple[str, int]: ...
    def record_of(self, seq: int) -> int: ...
    def label(self, record: int) -> str: ...
    def length(self, seq: int) -> int: ...
    def output_tokens(self, seq: int) -> int | None: ...


def make_prompt_source(
    workload: Workload, calibrations: Sequence[Calibration] = ()
) -> PromptSource:
    """The source the config asks for (a file source reads its file now). Synthetic
    prompts are sized by ``calibrations`` (each from its seq on; none: a word a token)."""
    prompts = workload.prompts
    if prompts.source == "file":
        assert prompts.file is not None  # the config model guarantees it
        return FilePrompts(prompts.file, prompts.prefix, workload.seed)
    if prompts.source != "synthetic":
        from soakd.workload.datasets import open_dataset  # it builds on this module

        return open_dataset(workload, calibrations)
    return SyntheticPrompts(prompts.input_tokens, workload.seed, calibrations, prompts.prefix)


def _mix(x: int) -> int:
    """splitmix64's finalizer: a bijection on 64 bits that scatters nearby inputs.
    A few integer operations, where seeding a ``random.Random`` per prompt costs 5 µs."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def seq_hash(key: int, seq: int) -> int:
    """The 64-bit draw of ``seq`` under ``key`` (a seed, mixed): the same on every target."""
    return _mix(key ^ (seq & _M64))


def draw_length(d: Lengths, h1: int) -> int:
    """The length ``d`` gives the draw ``h1`` (a ``seq_hash``), clamped to min..max."""
    if d.dist == "uniform":
        n = d.min + h1 % (d.max - d.min + 1)
    elif d.dist == "normal":
        # Box-Muller on two 53-bit uniforms taken from the hash
        u1 = ((h1 >> 11) + 1) / 9007199254740992.0  # (0, 1]
        u2 = (_mix(h1) >> 11) / 9007199254740992.0  # [0, 1)
        z = math.sqrt(-2.0 * math.log(u1)) * math.cos(math.tau * u2)
        n = round(d.mean + d.stddev * z)
    else:
        n = d.mean
    return min(d.max, max(d.min, n))


class _Sizing:
    """One calibration laid over the word pool: each word's cost, and the pool's running
    cost (``cum[j]``: the cost of pool words 0..j-1), so a prompt of a given cost is a
    bisection, not a sum."""

    __slots__ = ("cal", "costs", "cum", "max_words")

    def __init__(self, cal: Calibration, pool: Sequence[int], longest: int) -> None:
        self.cal = cal
        self.costs = cal.word_costs(len(WORDS))
        costs = self.costs
        self.cum = array("d", accumulate((costs[i] for i in pool), initial=0.0))
        # the most words a prompt can take: its tokens at the cheapest word, and one more
        self.max_words = math.ceil(max(1, longest) / min(costs)) + 1


class SyntheticPrompts:
    """Word-salad prompts with lengths drawn from a TokenLength distribution.

    Each prompt opens with up to four words that spell a scrambled seq, so no two
    prompts share their first tokens and prefix caching cannot hide prefill; the
    rest is a seq-chosen window into a pool of random words built once from the
    seed, so making a prompt is a slice, not a draw per word (~2 µs for 256 words).
    The window is as long as the planned tokens allow at the calibration's cost per word
    (calibration.py): without one, a word a token, as the word list was chosen for.
    """

    def __init__(
        self,
        lengths: Lengths,
        seed: int = 0,
        calibrations: Sequence[Calibration] = (),
        prefix: Prefix | None = None,
    ) -> None:
        self.lengths = lengths
        self.seed = seed
        self.prefix = prefix if prefix is not None and prefix.share > 0 else None
        self._key = _mix(seed & _M64)
        self._prefix_key = _mix(self._key ^ _PREFIX_SALT)
        longest = fixed_length(lengths) if lengths.dist == "fixed" else lengths.max
        self._longest = longest
        self._pool: list[int] = []
        self._text = ""
        self._starts = array("q")
        self._sizings: list[_Sizing] = []
        for cal in calibrations or (UNCALIBRATED,):
            self.calibrate(cal)

    @property
    def calibrations(self) -> list[Calibration]:
        """Every calibration in use, in seq order (the first from seq 0)."""
        return [s.cal for s in self._sizings]

    @property
    def calibration(self) -> Calibration:
        """The latest: the one new seqs are sized by."""
        return self._sizings[-1].cal

    def calibrate(self, cal: Calibration) -> None:
        """Size the prompts of ``cal.from_seq`` and later by ``cal``; earlier seqs keep
        theirs (a prompt already sent is never rebuilt otherwise)."""
        if self._sizings and cal.from_seq < self._sizings[-1].cal.from_seq:
            raise ValueError(
                f"calibration from seq {cal.from_seq} is before the last one's "
                f"({self._sizings[-1].cal.from_seq})"
            )
        if not self._sizings and cal.from_seq != 0:
            cal = replace(cal, from_seq=0)  # seq 0 needs one
        words = math.ceil(max(1, self._longest) / min(cal.word_costs(len(WORDS)))) + 1
        self._grow_pool(_POOL + words)
        self._sizings.append(_Sizing(cal, self._pool, self._longest))

    def _grow_pool(self, size: int) -> None:
        """The pool of word indices, at least ``size`` long: a longer pool is the same
        draws continued (``choices`` takes one random() a word), so nothing moves."""
        if len(self._pool) >= size:
            return
        self._pool = random.Random(self._key).choices(range(len(WORDS)), k=size)
        words = [WORDS[i] for i in self._pool]
        self._text = " ".join(words)
        # starts[i]: where word i begins; one past the end for i == len(words)
        self._starts = array("q", accumulate((len(w) + 1 for w in words), initial=0))
        self._sizings = [_Sizing(s.cal, self._pool, self._longest) for s in self._sizings]

    def length(self, seq: int) -> int:
        """The planned prompt length (tokens) of ``seq``."""
        return self._length(seq, _mix(self._key ^ (seq & _M64)))

    def _length(self, seq: int, h1: int) -> int:
        """The planned length of ``seq`` (``h1``: its draw): a dataset's subclass reads it."""
        return draw_length(self.lengths, h1)

    def prefix_of(self, seq: int) -> int | None:
        """Which shared prefix ``seq`` opens with (None: none), drawn from the seed alone."""
        p = self.prefix
        if p is None:
            return None
        h = _mix(self._prefix_key ^ (seq & _M64))
        if (h >> 11) / 9007199254740992.0 >= p.share:
            return None
        return _mix(h) % p.count

    def prefix_text(self, k: int, seq: int = 0) -> tuple[str, float]:
        """(text, its cost) of shared prefix ``k``, at the calibration of ``seq``."""
        tokens = self.prefix.tokens if self.prefix is not None else 0
        return self.window(self._prefix_key ^ k, tokens, seq)

    def _sizing_of(self, seq: int) -> _Sizing:
        sizing = self._sizings[-1]
        if seq < sizing.cal.from_seq:
            sizing = next(s for s in reversed(self._sizings) if seq >= s.cal.from_seq)
        return sizing

    def window(self, key: int, tokens: float, seq: int = 0) -> tuple[str, float]:
        """(text, its cost) of about ``tokens`` tokens at the calibration of ``seq``: pool
        words from a place ``key`` picks, so the same key gives the same text (a shared
        prefix, a Mooncake block). ``tokens`` is at most the longest planned prompt."""
        sizing = self._sizing_of(seq)
        cum = sizing.cum
        start = _mix(key ^ 0x2545F4914F6CDD1D) % _POOL
        base = cum[start]
        # the window whose cost is nearest (the shorter one on a tie)
        end = bisect_left(cum, base + tokens, start, start + sizing.max_words)
        if end > start and base + tokens - cum[end - 1] <= cum[end] - (base + tokens):
            end -= 1
        if end == start:
            return "", 0.0
        starts = self._starts
        return self._text[starts[start] : starts[end] - 1], cum[end] - base

    def spec_fields(self, seq: int) -> tuple[str, int]:
        text, n, _ = self.build(seq)
        return text, n

    def estimate(self, seq: int) -> float:
        """The tokens the calibration expects the reference to count for ``seq``."""
        return self.build(seq)[2]

    def build(self, seq: int) -> tuple[str, int, float]:
        """(prompt text, planned tokens, tokens the calibration expects) for ``seq``: its
        shared prefix if it draws one, four words that spell it, then a window of the pool."""
        h1 = _mix(self._key ^ (seq & _M64))
        n = self._length(seq, h1)
        sizing = self._sizing_of(seq)
        costs = sizing.costs
        budget = n - sizing.cal.overhead
        lead = ""
        k = self.prefix_of(seq)
        if k is not None and self.prefix is not None:
            lead, cost = self.prefix_text(k, seq)
            budget -= cost
            lead += " "
        x = (seq * _HEAD_MULT + self._key) & _HEAD_MASK
        head = [(x >> (10 * i)) & 1023 for i in range(_HEAD_WORDS)]
        spent = sum(costs[i] for i in head)
        while len(head) > 1 and spent > budget:  # a short prompt: fewer opening words
            spent -= costs[head.pop()]
        text = lead + " ".join([WORDS[i] for i in head])
        rest, tail_cost = self.window(h1, budget - spent, seq) if budget > spent else ("", 0.0)
        estimate = n - budget + spent + tail_cost
        return (text + " " + rest if rest else text), n, estimate


class FilePrompts:
    """Prompts from a JSONL file, used in order and cycled.

    Each line is ``{"prompt": "..."}`` or ``{"messages": [...]}`` (the message
    contents joined by newlines), with an optional ``"output_tokens"``: its answer's
    planned length (soakd/workload/answers.py); blank lines are skipped. The planned
    length is an estimate (``len(text) / 4``): soakd has no tokenizer, and the server's
    usage count wins anyway. The file is checked whole at once and indexed (records.py):
    each request reads its line again. After one full cycle prompts repeat, so a server's
    prefix cache will start to hit: give a file longer than the run if that matters.
    """

    def __init__(self, path: Path | str, prefix: Prefix | None = None, seed: int = 0) -> None:
        self.path = Path(path)
        # shared prefixes: the synthetic prompts' words (a word a token, uncalibrated)
        self._prefixes = (
            SyntheticPrompts(TokenLength(mean=prefix.tokens + 1, max=MAX_TOKENS), seed, (), prefix)
            if prefix is not None and prefix.share > 0
            else None
        )
        self._planned = array("i")  # each line's estimate, in tokens
        self._outputs = array("i")  # each line's planned answer length (0: none)
        self._file = index_lines(self.path, self._check, "prompts")
        self.plans_outputs = any(self._outputs)
        """Some line gives its answer's length."""

    def _check(self, obj: Any, _i: int) -> None:
        text = _prompt_text(obj)
        if len(text) > MAX_TOKENS * CHARS_PER_TOKEN:
            raise BadRecord(
                f"a prompt of {len(text):,} characters, "
                f"~{len(text) // CHARS_PER_TOKEN:,} tokens (at most {MAX_TOKENS:,})"
            )
        self._outputs.append(_output_tokens(obj) or 0)
        self._planned.append(max(1, round(len(text) / CHARS_PER_TOKEN)))

    def __len__(self) -> int:
        return len(self._planned)

    def _prefix(self, seq: int) -> tuple[str, float] | None:
        shared = self._prefixes
        k = None if shared is None else shared.prefix_of(seq)
        return None if shared is None or k is None else shared.prefix_text(k)

    def spec_fields(self, seq: int) -> tuple[str, int]:
        record = self.record_of(seq)
        text = _prompt_text(json.loads(self._file.read(record)))
        n = self._planned[record]
        lead = self._prefix(seq)
        return (text, n) if lead is None else (lead[0] + "\n" + text, n + round(lead[1]))

    def length(self, seq: int) -> int:
        """The planned prompt length (tokens) of ``seq``."""
        lead = self._prefix(seq)
        return self._planned[self.record_of(seq)] + (0 if lead is None else round(lead[1]))

    def record_of(self, seq: int) -> int:
        """The line (0-based, blank lines left out) ``seq`` sends: the lines cycle."""
        return seq % len(self._planned)

    def label(self, record: int) -> str:
        return f"{self.path.name}:{self._file.line(record)}"

    def output_tokens(self, seq: int) -> int | None:
        """The planned answer length the line of ``seq`` gives (None: it gives none)."""
        return self._outputs[self.record_of(seq)] or None


def _prompt_text(obj: Any) -> str:
    """The text of one JSONL record."""
    if not isinstance(obj, dict):
        raise BadRecord(f'expected an object with "prompt" or "messages", got {type(obj).__name__}')
    if "prompt" in obj:
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise BadRecord('"prompt" must be a non-empty string')
        return prompt
    if "messages" in obj:
        messages = obj["messages"]
        if not isinstance(messages, list) or not messages:
            raise BadRecord('"messages" must be a non-empty list')
        parts = [_content_text(m, i) for i, m in enumerate(messages)]
        text = "\n".join(p for p in parts if p)
        if not text:
            raise BadRecord('"messages" hold no text')
        return text
    raise BadRecord('expected a "prompt" or a "messages" key')


def _output_tokens(obj: dict[str, Any]) -> int | None:
    """A record's planned answer length: a whole number of tokens, 1 to MAX_TOKENS."""
    if "output_tokens" not in obj:
        return None
    n = obj["output_tokens"]
    if type(n) is not int or not 1 <= n <= MAX_TOKENS:
        shown = json.dumps(n)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise BadRecord(
            f'"output_tokens" must be a whole number of tokens from 1 to {MAX_TOKENS:,}, '
            f"got {shown}"
        )
    return n


def _content_text(message: Any, index: int) -> str:
    """A message's content: a string, or OpenAI's list of parts (text parts kept)."""
    if not isinstance(message, dict) or "content" not in message:
        raise BadRecord(f'messages[{index}] must be an object with "content"')
    content = message["content"]
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    raise BadRecord(f"messages[{index}].content must be a string or a list of parts")
