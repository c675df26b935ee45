"""Proposers: what drafts the tokens the target verifies (``docs/proposers.md``).

The interface is :class:`~dflash_jax.proposers.base.Proposer` (set up from the prompt's taps,
propose a block, observe the verified rows). A drafting method's proposer lives in its package
(``dflash_jax/methods/<name>/proposer.py``); the ones here are not tied to a drafter checkpoint
(``emulated``)."""

from dflash_jax.proposers.base import Committed, Proposal, Proposer

__all__ = ["Committed", "Proposal", "Proposer"]
