"""Simulator room: a pure, clock-free model of vLLM's continuous-batching scheduler.

No IO and no clock: ``step()`` plans one engine iteration, advances the state as if
it had run, and says how long it would take. The server sleeps that long and then
hands the tokens out; tests add the durations up instead.

The model follows vLLM v1's scheduler closely enough for soak tests to see the
same shapes as on a real card:

- running sequences are served first, one token each (or a prefill chunk), within
  a per-step token budget (``max_num_batched_tokens``, chunked prefill);
- waiting sequences are admitted in arrival order while fewer than
  ``max_num_seqs`` run and the KV cache has room: past that, requests queue;
- KV cache is allocated in blocks; when a running sequence needs a block and none
  is free, the most recently admitted one is preempted (recompute: its cache is
  dropped and it goes back to the head of the queue);
- the step that completes a prefill also samples the first token (TTFT), a step
  that mixes a long prefill with decodes delays every decode (ITL spikes).
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass
from typing import Literal

from soakd.profiles import Profile

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token of one sequence; ``finish`` is set on its last token."""

    seq_id: int
    finish: FinishReason | None


@dataclass(frozen=True, slots=True)
class Step:
    """One planned engine iteration. ``tokens`` appear when ``duration_s`` has passed."""

    duration_s: float
    tokens: tuple[TokenEvent, ...]
    scheduled: tuple[int, ...]  # sequences that left the waiting queue at this step's start
    preempted: tuple[int, ...]
    batch_size: int  # sequences in the batch
    batch_tokens: int  # tokens computed (prefill chunks + one per decode)


@dataclass(slots=True, eq=False)
class _Seq:
    seq_id: int
    prompt_tokens: int
    max_tokens: int
    stop_at: int  # generated tokens after which it ends (== max_tokens: "length")
    generated: int = 0
    computed: int = 0  # tokens whose KV is cached
    blocks: int = 0

    @property
    def pending(self) -> int:
        """Tokens to compute before the next sample: the prompt (or the whole context
        after a preemption), then the last sampled token."""
        return self.prompt_tokens + self.generated - self.computed


class Engine:
    """The scheduler state. Not thread-safe; the server drives it from the event loop."""

    def __init__(self, profile: Profile, seed: int | None = None) -> None:
        self.profile = profile
        self._rng = random.Random(profile.seed if seed is None else seed)
        self._next_id = 0
        self._waiting: deque[_Seq] = deque()
        self._running: dict[int, _Seq] = {}  # admission order (dicts keep it)
        self._free_blocks = profile.kv_cache_blocks
        self.num_preemptions = 0

    # -- inputs -------------------------------------------------------------------

    def submit(
        self, prompt_tokens: int, max_tokens: int, *, ignore_eos: bool = False, min_tokens: int = 0
    ) -> int:
        """Queue a request and return its sequence id.

        The caller validates lengths (``prompt_tokens + max_tokens <= max_model_len``);
        when the profile has an EOS probability and ``ignore_eos`` is false, the stop
        point is drawn now, so one seed gives one run. As vLLM's ``min_tokens``, no EOS
        comes before ``min_tokens`` tokens: the first may be the one after them.
        """
        if prompt_tokens < 1 or max_tokens < 1:
            raise ValueError(
                f"prompt_tokens and max_tokens must be >= 1: {prompt_tokens}, {max_tokens}"
            )
        if prompt_tokens + max_tokens > self.profile.max_model_len:
            raise ValueError(
                f"{prompt_tokens} + {max_tokens} tokens exceed max_model_len "
                f"{self.profile.max_model_len}"
            )
        stop_at = max_tokens
        p = self.profile.eos_probability
        earliest = max(0, min_tokens)  # tokens before the first that may be an EOS
        if p >= 1.0 and not ignore_eos:
            stop_at = min(max_tokens, earliest + 1)
        elif p > 0.0 and not ignore_eos:
            # Geometric: the number of tokens up to and including the first EOS.
            u = 1.0 - self._rng.random()  # (0, 1]
            stop_at = min(max_tokens, earliest + 1 + int(math.log(u) / math.log1p(-p)))
        seq_id = self._next_id
        self._next_id += 1
        self._waiting.append(_Seq(seq_id, prompt_tokens, max_tokens, stop_at))
        return seq_id

    def abort(self, seq_id: int) -> bool:
        """Drop a sequence wherever it is (client gone); frees its cache at once."""
        seq = self._running.pop(seq_id, None)
        if seq is not None:
            self._free(seq)
            return True
        for seq in self._waiting:
            if seq.seq_id == seq_id:
                self._waiting.remove(seq)
                self._free(seq)
                return True
        return False

    # -- state --------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks in use: vLLM's ``kv_cache_usage_perc`` (0..1)."""
        total = self.profile.kv_cache_blocks
        return (total - self._free_blocks) / total

    # -- the iteration ------------------------------------------------------------

    def step(self) -> Step:
        """Plan and apply one iteration. Raises if there is nothing to do."""
        if not self.has_work():
            raise RuntimeError("step() with no running or waiting sequences")
        p = self.profile
        budget = p.max_num_batched_tokens
        plan: list[tuple[_Seq, int]] = []
        preempted: list[int] = []

        # 1. Running sequences first, oldest first.
        running = deque(self._running.values())
        while running:
            seq = running.popleft()
            n = min(seq.pending, budget)
            if n <= 0:
                continue
            while not self._allocate(seq, n):
                # No free block: preempt the newest running sequence, which may be
                # this one when nothing newer is left.
                victim = running.pop() if running else seq
                self._preempt(victim)
                preempted.append(victim.seq_id)
                if victim is seq:
                    break
            if seq.seq_id in self._running:
                plan.append((seq, n))
                budget -= n

        # 2. Admit waiting sequences while there is room (not after a preemption).
        scheduled: list[int] = []
        if not preempted:
            while self._waiting and len(self._running) < p.max_num_seqs and budget > 0:
                seq = self._waiting[0]
                n = min(seq.pending, budget)
                if not self._allocate(seq, n):
                    break  # head-of-line: the queue waits for cache
                self._waiting.popleft()
                self._running[seq.seq_id] = seq
                scheduled.append(seq.seq_id)
                plan.append((seq, n))
                budget -= n

        if not plan:
            raise RuntimeError("scheduler made no progress")  # a profile invariant broke

        # 3. Cost of the step, with the cache as it was read during the step.
        batch = len(plan)
        batch_tokens = sum(n for _, n in plan)
        cached = sum(seq.computed for seq, _ in plan)
        duration = (
            p.decode_s_per_step * (1.0 + p.decode_slowdown_per_seq * (batch - 1))
            + p.decode_s_per_kv_token * cached
            + (batch_tokens - batch) / p.prefill_tokens_per_s
        )

        # 4. Apply: sequences whose context is complete sample one token.
        tokens: list[TokenEvent] = []
        for seq, n in plan:
            seq.computed += n
            if seq.pending > 0:
                continue  # a prefill chunk; more to come
            seq.generated += 1
            finish: FinishReason | None = None
            if seq.generated >= seq.stop_at:
                finish = "stop" if seq.stop_at < seq.max_tokens else "length"
                del self._running[seq.seq_id]
                self._free(seq)
            tokens.append(TokenEvent(seq.seq_id, finish))

        return Step(
            duration_s=duration,
            tokens=tuple(tokens),
            scheduled=tuple(scheduled),
            preempted=tuple(preempted),
            batch_size=batch,
            batch_tokens=batch_tokens,
        )

    # -- cache --------------------------------------------------------------------

    def _allocate(self, seq: _Seq, new_tokens: int) -> bool:
        need = -(-(seq.computed + new_tokens) // self.profile.block_size) - seq.blocks
        if need > self._free_blocks:
            return False
        if need > 0:
            seq.blocks += need
            self._free_blocks -= need
        return True

    def _free(self, seq: _Seq) -> None:
        self._free_blocks += seq.blocks
        seq.blocks = 0

    def _preempt(self, seq: _Seq) -> None:
        del self._running[seq.seq_id]
        self._free(seq)
        seq.computed = 0  # recompute: prompt and generated tokens are prefilled again
        self._waiting.appendleft(seq)
        self.num_preemptions += 1
