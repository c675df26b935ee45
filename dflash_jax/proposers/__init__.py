"""Proposers: what drafts the tokens the target verifies (``docs/proposers.md``).

The interface is :class:`~dflash_jax.proposers.base.Proposer` (set up from the prompt's taps,
propose a block, observe the verified rows); DFlash's block-diffusion drafter is
:class:`~dflash_jax.proposers.dflash.DFlashProposer`. A new proposer is one module here."""

from dflash_jax.proposers.base import Committed, Proposal, Proposer
from dflash_jax.proposers.dflash import DFlashProposer, DFlashState

__all__ = ["Committed", "DFlashProposer", "DFlashState", "Proposal", "Proposer"]
