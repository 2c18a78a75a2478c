"""Prompt lookup: draft by copying what followed the last n-gram's latest earlier occurrence."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

from specsample._array import Array, check_int, check_shape, device, namespace
from specsample.core.params import SamplingParams
from specsample.core.protocols import Proposal

__all__ = ["PromptLookupDrafter"]


class PromptLookupDrafter:
    """Deterministic drafts from the context itself (Proposal.probs is None: q one-hot).

    For each row, the last n committed tokens (n = ngram_max down to ngram_min)
    are searched for at an earlier position; the K tokens that followed the
    most recent match are proposed. With no match, the last token is repeated.
    Any deterministic guess is lossless; a good one is merely accepted more often.

    `draft_lengths` shortens a row's round when its context does not end in an n-gram of at
    least `confident` tokens seen before: one draft after a shorter match (rarely accepted:
    `auto` runs such rounds only where their own record of acceptance pays for the wider
    verify), and no draft (one token from p) without any match, since repeating the last
    token is no guess; a round where no row drafts is a plain step. A wide verify is not
    free on a CPU (for a 135M model on 2 cores, 5 positions cost about one and a half
    one-token forwards), so only a confident match earns all K drafts. The choice reads
    the row's committed tokens only, so it does not change the output law.

    Args:
        ngram_max: the longest suffix tried, >= ngram_min.
        ngram_min: the shortest suffix tried, >= 1.
        confident: the shortest match that earns all K drafts a verify, in
            [ngram_min, ngram_max]; "auto": 2 clipped to that range; None: verify K
            every round.
    """

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1,
                 confident: int | Literal["auto"] | None = "auto") -> None:
        check_int("ngram_max", ngram_max, 1)
        check_int("ngram_min", ngram_min, 1)
        if ngram_min > ngram_max:
            raise ValueError(f"ngram_min: expected <= ngram_max = {ngram_max}, got {ngram_min}")
        if confident == "auto":
            confident = min(max(2, ngram_min), ngram_max)
        if confident is not None and (isinstance(confident, bool) or not isinstance(confident, int)
                                      or not ngram_min <= confident <= ngram_max):
            raise ValueError(f"confident: expected None or an int in [{ngram_min}, {ngram_max}], "
                             f"got {confident!r}")
        self.ngram_max, self.ngram_min, self.confident = ngram_max, ngram_min, confident

    def start(self, tokens: Array, lengths: Array, capacity: int) -> None:
        """No state: every proposal is computed from the committed tokens."""
        return None

    def advance(self, state: Any, lengths: Array) -> None:
        """No state to move."""
        return None

    def _match_ends(self, xp: Any, tokens: Array, lengths: Array) -> dict[int, Array]:
        """For each suffix length n in [ngram_min, ngram_max], int64 [B]: the latest end
        e <= L-2 with tokens[e-n+1 : e+1] == the row's last n tokens, else -1.

        One pass for every n: a position matches n tokens where it matches n - 1 and the
        token n - 1 before it equals the row's (n-1)-th last, so each n adds one comparison.
        """
        batch, width = (int(d) for d in tokens.shape)
        dev = device(tokens)
        pos = xp.arange(width, dtype=xp.int64, device=dev)[None, :]  # [1, C]
        back = xp.arange(self.ngram_max, dtype=xp.int64, device=dev)[None, :]  # [1, n_max]
        last = xp.take_along_axis(tokens, xp.clip(lengths[:, None] - 1 - back, min=0), axis=1)  # [B, n_max]
        before = pos <= (lengths - 2)[:, None]  # [B, C]: ends strictly before the suffix's own
        ends: dict[int, Array] = {}
        run = None
        for j in range(self.ngram_max):
            same = tokens == last[:, j : j + 1]  # [B, C] at the token j before each end
            if j:  # align: position p reads the token at p - j (none before the row's start)
                same = xp.concat([xp.zeros((batch, j), dtype=xp.bool, device=dev), same[:, : width - j]],
                                 axis=1)
            run = same if run is None else run & same
            n = j + 1
            if n >= self.ngram_min:
                found = run & before & (lengths >= n)[:, None]
                ends[n] = xp.max(xp.where(found, pos, -1), axis=1)
        return ends

    def _inputs(self, tokens: Array, lengths: Array) -> tuple[Any, Array, Array, Callable[[int], Array]]:
        """Checked int64 inputs and the row-wise latest match end for each suffix length n,
        all scanned together, once, when first asked."""
        xp = namespace(tokens, lengths)
        check_shape("tokens", tokens, (None, None))
        check_shape("lengths", lengths, (int(tokens.shape[0]),))
        tokens, lengths = xp.astype(tokens, xp.int64), xp.astype(lengths, xp.int64)
        scan = functools.cache(lambda: self._match_ends(xp, tokens, lengths))
        return xp, tokens, lengths, lambda n: scan()[n]

    def _lengths(self, xp: Any, lengths: Array, k: int, ends: Callable[[int], Array]) -> Array:
        if self.confident is None or k == 0:
            return xp.full_like(lengths, k)
        full = ends(self.confident) >= 0  # [B]
        short = ends(self.ngram_min) >= 0 if self.confident > self.ngram_min else xp.zeros_like(full)
        return xp.where(full, k, xp.where(short, min(k, 1), 0))

    def _copies(self, xp: Any, tokens: Array, lengths: Array, k: int,
                ends: Callable[[int], Array]) -> Proposal:
        # No match: pretend one ended at L-2, so the last token repeats.
        end = lengths - 2
        for n in range(self.ngram_min, self.ngram_max + 1):  # longer matches win
            found = ends(n)
            end = xp.where(found >= 0, found, end)
        # What follows the match is known up to L-1; beyond, the suffix is
        # assumed to repeat with period L-1-end (the distance to the match).
        period = lengths - 1 - end  # [B], >= 1
        steps = xp.arange(k, dtype=xp.int64, device=device(tokens))[None, :]  # [1, k]
        index = (end + 1)[:, None] + steps % period[:, None]  # [B, k], all <= L-1
        return Proposal(tokens=xp.take_along_axis(tokens, index, axis=1), probs=None, state=None)

    def draft_lengths(self, tokens: Array, lengths: Array, k: int) -> Array:
        """The drafts worth verifying this round, per row: int64 [B] in [0, k].

        k where the row's last `confident` tokens occurred before; else 1 where its
        last `ngram_min` tokens did; else 0 (a plain step for that row). Each row's
        length reads that row's committed tokens only: it does not depend on the
        other rows of the batch, and it never reads the target.

        Args:
            tokens: int [B, C] committed ids, row b valid on [0, lengths[b]).
            lengths: int [B], each >= 1.
            k: the K the policy chose, >= 0.
        """
        check_int("k", k, 0)
        xp, _, lengths, ends = self._inputs(tokens, lengths)
        return self._lengths(xp, lengths, k, ends)

    def propose(self, state: Any, tokens: Array, lengths: Array, k: int,
                params: SamplingParams, uniforms: Array) -> Proposal:
        """Copy the k tokens after the best match; `params` and `uniforms` are unused.

        Args:
            tokens: int [B, C] committed ids, row b valid on [0, lengths[b]).
            lengths: int [B], each >= 1.
            k: the number of tokens to propose, >= 1.

        Returns:
            A Proposal with tokens int64 [B, k] and probs None.
        """
        check_int("k", k, 1)
        xp, tokens, lengths, ends = self._inputs(tokens, lengths)
        return self._copies(xp, tokens, lengths, k, ends)

    def lengths_and_copies(self, tokens: Array, lengths: Array, k: int) -> tuple[Array, Proposal]:
        """`draft_lengths` and `propose` together, from one scan per suffix length (for a
        caller that needs both in one round, such as `HybridDrafter`).

        Args:
            tokens: int [B, C] committed ids, row b valid on [0, lengths[b]).
            lengths: int [B], each >= 1.
            k: the number of tokens to propose, >= 1.
        """
        check_int("k", k, 1)
        xp, tokens, lengths, ends = self._inputs(tokens, lengths)
        return self._lengths(xp, lengths, k, ends), self._copies(xp, tokens, lengths, k, ends)
