"""An emulated-acceptance proposer: a trained drafter's acceptance on a random-weight pair
(``docs/proposers.md``, "Emulated acceptance").

A random-weight target and drafter measure the cost of decoding but accept almost nothing, so
their speed is not a trained pair's. :class:`EmulatedProposer` replaces the drafts: it holds a
known continuation per row (the prompt followed by the target's own greedy autoregressive
output, computed beforehand with plain ``generate``) and, each iteration, draws the row's number
of correct drafts ``a`` from a stated acceptance model, then proposes the continuation's next
``a`` tokens followed by wrong ones (continuation token + 1 mod V). Under greedy verification
the target accepts exactly ``a`` drafts, and the output is the continuation's (autoregressive
decoding's).

The acceptance model is geometric with a per-position acceptance ``alpha``, truncated at the
block's ``bs - 1`` drafts: ``P(a >= k) = alpha^k`` for ``k = 0 .. bs-1``, so the acceptance
length ``L = a + 1`` has ``P(L = l) = alpha^(l-1) (1 - alpha)`` for ``l < bs`` and
``P(L = bs) = alpha^(bs-1)``, and its mean (tau) is :func:`geometric_tau`. The paper publishes
tau per prompt set but no per-position rates; :func:`alpha_for_tau` fits ``alpha`` to a tau.

Optionally (``charge``, on when a DFlash drafter's config is given) each iteration also runs
that drafter (its context update and its forward over the block, as
:class:`~dflash_jax.methods.dflash.proposer.DFlashProposer` does) and discards its drafts, so a
measured iteration includes the draft's cost.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.proposers.base import Committed, Proposal, Proposer
from dflash_jax.methods.dflash.handle import Drafter
from dflash_jax.methods.dflash.proposer import DFlashProposer


# ---------------------------------------------------------------------------- the acceptance model
def _check_alpha(alpha) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating, np.integer)) \
            or not math.isfinite(float(alpha)) or not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"alpha (the per-position acceptance probability) must be a number in "
                         f"[0, 1], got {alpha!r}: fit one to a tau with alpha_for_tau(tau, block_size)")
    return float(alpha)


def _check_block(block_size) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size < 2:
        raise ValueError(f"block_size must be an integer >= 2 (the bonus row and at least one draft), "
                         f"got {block_size!r}")
    return int(block_size)


def acceptance_probs(alpha: float, block_size: int) -> np.ndarray:
    """float64[block_size]: P(acceptance length L = l) for l = 1 .. block_size under the
    truncated geometric model (module docstring)."""
    alpha, bs = _check_alpha(alpha), _check_block(block_size)
    p = np.array([alpha ** (l - 1) * (1.0 - alpha) for l in range(1, bs + 1)])
    p[-1] = alpha ** (bs - 1)  # every draft accepted
    return p


def geometric_tau(alpha: float, block_size: int) -> float:
    """Mean acceptance length (bonus included) of the model: sum_{k<bs} alpha^k
    = (1 - alpha^bs) / (1 - alpha)."""
    alpha, bs = _check_alpha(alpha), _check_block(block_size)
    return float(bs) if alpha == 1.0 else (1.0 - alpha ** bs) / (1.0 - alpha)


def alpha_for_tau(tau: float, block_size: int = 16) -> float:
    """The ``alpha`` whose :func:`geometric_tau` at ``block_size`` is ``tau`` (bisection; tau
    increases with alpha from 1 at alpha = 0 to block_size at alpha = 1)."""
    bs = _check_block(block_size)
    if not 1.0 <= float(tau) <= bs:
        raise ValueError(f"tau {tau} must lie between 1 and the block size {bs} (tau counts the bonus "
                         "token: accepted drafts + 1)")
    lo, hi = 0.0, 1.0
    for _ in range(64):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if geometric_tau(mid, bs) < tau else (lo, mid)
    return 0.5 * (lo + hi)


def draw_accepted(key, alpha: float, batch: int, drafts: int) -> jax.Array:
    """int32[batch]: accepted drafts per row, P(a >= k) = alpha^k for k <= ``drafts``: the
    leading run of successes of ``drafts`` independent Bernoulli(alpha) trials."""
    ok = jax.random.uniform(key, (batch, drafts)) < alpha
    return jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)


# ---------------------------------------------------------------------------- the proposer
@dataclasses.dataclass(frozen=True, eq=False)  # compared (and hashed) by identity: it holds arrays
class EmulatedProposer(Proposer):
    """rows: int32[B, W] per row the prompt then the target's greedy continuation (position p
    of the row = ``rows[b, p]``), -1 past ``known[b]`` tokens. alpha: the per-position
    acceptance of the model. drafter: a DFlash drafter config whose forward is charged each
    iteration (its parameters are ``generate``'s ``drafter``); charge: run it (default: when
    given). Build one with :meth:`from_reference`. ``rows=None`` (``known=()``): the rows are
    an input of the compiled loop instead of a constant of it, read from the parameters
    (``{"rows", "drafter"}``; :func:`emulated_generate` with ``as_input=True`` builds them), so
    that a new continuation of the same shape reuses the compiled loop."""

    rows: Any
    known: tuple[int, ...]
    alpha: float
    drafter: DrafterConfig | None = None
    charge: bool | None = None

    def __post_init__(self):
        _check_alpha(self.alpha)
        if self.rows is None:
            if self.known or not self.charged:
                raise ValueError("rows=None (the rows an input) needs known=() and a charged drafter config")
            return
        rows = np.asarray(self.rows)
        if rows.ndim != 2 or not np.issubdtype(rows.dtype, np.integer):
            raise ValueError(f"rows must be an int array [B, W] (prompt + continuation per row), got "
                             f"{rows.dtype}{list(rows.shape)}")
        if len(self.known) != rows.shape[0] or any(not 0 < k <= rows.shape[1] for k in self.known):
            raise ValueError(f"known must give, per row of rows ({rows.shape[0]}), the known tokens "
                             f"(1 .. {rows.shape[1]}), got {self.known}")
        if self.charge and self.drafter is None:
            raise ValueError("charge=True runs a DFlash drafter's forward each iteration: give its config "
                             "(drafter=DrafterConfig, and the drafter to generate)")

    @classmethod
    def from_reference(cls, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
                       alpha: float, drafter: DrafterConfig | None = None,
                       charge: bool | None = None) -> "EmulatedProposer":
        """From the prompts and the target's greedy output after each (``GenerateResult.sequences``
        of ``generate(target, prompts, n)`` without a drafter)."""
        if len(prompts) != len(continuations):
            raise ValueError(f"{len(prompts)} prompts but {len(continuations)} continuations: give one "
                             "continuation (the target's greedy output) per prompt")
        full = [list(map(int, p)) + list(map(int, c)) for p, c in zip(prompts, continuations)]
        rows = np.full((len(full), max(map(len, full))), -1, np.int32)
        for b, r in enumerate(full):
            rows[b, :len(r)] = r
        return cls(rows, tuple(len(r) for r in full), _check_alpha(alpha), drafter, charge)

    @property
    def charged(self) -> bool:
        """Whether each iteration runs the drafter's forward (and discards it)."""
        return self.drafter is not None and self.charge is not False

    def _dflash(self) -> DFlashProposer:
        return DFlashProposer(self.drafter)

    def check_budget(self, prompts: Sequence[Sequence[int]], max_new_tokens) -> None:
        """Refuses prompts that are not the continuation's, or a budget past what it knows
        (the engine would then verify drafts nobody knows: the acceptance would not follow the
        model)."""
        if self.rows is None:
            raise ValueError("this proposer reads its rows from its parameters: give emulated_generate one "
                             "built with EmulatedProposer.from_reference (as_input=True makes the input form)")
        B = len(self.known)
        if len(prompts) != B:
            raise ValueError(f"the proposer holds {B} continuations but {len(prompts)} prompts were given")
        budgets = [max_new_tokens] * B if np.isscalar(max_new_tokens) else list(max_new_tokens)
        rows = np.asarray(self.rows)
        for b, (p, n) in enumerate(zip(prompts, budgets)):
            if list(rows[b, :len(p)]) != [int(t) for t in p]:
                raise ValueError(f"prompt {b} is not the prefix of continuation {b}: build the proposer "
                                 "from these prompts (EmulatedProposer.from_reference)")
            if len(p) + int(n) > self.known[b]:
                raise ValueError(f"continuation {b} knows {self.known[b] - len(p)} tokens after its prompt but the "
                                 f"budget is {n}: compute the reference with at least max_new_tokens={n}")

    @property
    def tap_layer_ids(self) -> tuple[int, ...]:
        return self.drafter.target_layer_ids if self.charged else ()

    def _split(self, params):
        """(rows int32[B, W], the drafter's parameters) of this proposer and ``params``."""
        if self.rows is None:
            return params["rows"], params["drafter"]
        return jnp.asarray(self.rows, jnp.int32), params

    def init(self, spec, params, taps, positions, lengths, cache_len, dtype, *, tokens=None, tparams=None):
        if not self.charged:
            return None
        _, params = self._split(params)
        if params is None:
            raise ValueError("the emulated proposer charges a DFlash drafter's forward: pass the drafter "
                             "(generate(..., drafter=d)) or charge=False")
        return self._dflash().init(spec, params, taps, positions, lengths, cache_len, dtype,
                                   tokens=tokens, tparams=tparams)

    def propose(self, spec, tparams, params, state, committed: Committed, key,
                want_logp: bool = False) -> tuple[Proposal, Any]:
        """Row b: ``a_b`` drawn from the model, then the continuation's tokens at positions
        ``start+1 ..`` with those from draft index ``a_b`` on made wrong (+1 mod V)."""
        if not spec.sampling.greedy:
            raise ValueError("the emulated proposer emulates greedy acceptance (the target accepts exactly "
                             "the drafts that equal its continuation): decode with temperature 0")
        rows, params = self._split(params)
        bs, V = spec.block_size, spec.target.vocab_size
        B = committed.start.shape[0]
        if B != rows.shape[0]:
            raise ValueError(f"the proposer holds {rows.shape[0]} continuations but the batch has {B} rows")
        idx = committed.start[:, None] + 1 + jnp.arange(bs - 1, dtype=jnp.int32)
        truth = jnp.maximum(jnp.take_along_axis(rows, jnp.minimum(idx, rows.shape[1] - 1), axis=1), 0)
        accepted = draw_accepted(key, self.alpha, B, bs - 1)
        good = jnp.arange(bs - 1)[None] < accepted[:, None]
        tokens = jnp.where(good, truth, (truth + 1) % V)
        if self.charged:
            draft, state = self._dflash().propose(spec, tparams, params, state, committed, key)
            # the draft is discarded, but kept live (a token id is never >= V), so the compiled
            # iteration includes its cost
            tokens = jnp.where(draft.tokens >= V, draft.tokens, tokens)
        # the model's own confidence (not the oracle's knowledge): log alpha per draft
        logp = jnp.full(tokens.shape, math.log(max(self.alpha, 1e-30)), jnp.float32) if want_logp else None
        return Proposal(tokens, None, logp), state

    def observe(self, spec, params, state, taps, positions):
        return self._dflash().observe(spec, None, state, taps, positions) if self.charged else state


_AS_INPUT: dict = {}  # (alpha, drafter config, charge) -> the one proposer reading its rows from its params


def emulated_generate(target, prompts, max_new_tokens, proposer: EmulatedProposer, *, drafter=None,
                      as_input: bool = False, **options):
    """``generate(target, prompts, max_new_tokens, drafter=drafter, proposer=proposer,
    **options)`` after the emulation's checks: greedy (temperature 0), the prompts the proposer
    was built from, a budget it knows. Block size: the drafter's (else ``block_size=``).
    ``as_input``: the continuation goes in as an input of the compiled loop (with the drafter's
    parameters), so that another continuation of the same shape and the same alpha, drafter and
    charge reuses the compiled loop (needs a charged drafter, on one device)."""
    from dflash_jax.decoding.generation import generate  # the engine sits above the proposers

    if not isinstance(proposer, EmulatedProposer):
        raise ValueError(f"proposer must be an EmulatedProposer, got {type(proposer).__name__}")
    if float(options.get("temperature", 0.0) or 0.0) != 0.0:
        raise ValueError(f"the emulated proposer emulates greedy acceptance: temperature must be 0, got "
                         f"{options['temperature']}")
    if proposer.charged and drafter is None:
        raise ValueError("the emulated proposer charges a DFlash drafter's forward: pass drafter=, or build "
                         "it with charge=False")
    proposer.check_budget(prompts, max_new_tokens)
    if as_input and proposer.rows is not None:
        if not proposer.charged or drafter.mesh is not None:
            raise ValueError("as_input=True passes the continuation with a charged drafter's parameters, on "
                             "one device: give the proposer a drafter config and the drafter (no mesh)")
        key = (proposer.alpha, proposer.drafter, proposer.charge)
        dynamic = _AS_INPUT.setdefault(key, EmulatedProposer(None, (), *key))
        drafter = Drafter(drafter.config, {"rows": jnp.asarray(proposer.rows, jnp.int32),
                                           "drafter": drafter.params}, drafter.path)
        proposer = dynamic
    return generate(target, prompts, max_new_tokens, drafter=drafter, proposer=proposer, **options)
