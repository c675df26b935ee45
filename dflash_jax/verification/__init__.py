"""Verification: what the target does with a proposer's drafts, below the proposers and the
engine (``docs/methods.md``).

  * ``policy``: the verify-policy interface and ``FixedVerify`` (the whole block);
  * ``adaptive``: ``AdaptiveVerify`` (the verify length per iteration, per batch or per row);
  * ``tree``: the draft tree a proposer returns, its masks, and ``TreeVerify``;
  * ``acceptance``: every acceptance rule (chain match, rejection sampling, tree greedy, tree
    multi-draft);
  * ``sampling``: the sampling filters (temperature, top-k, top-p) both sides apply.
"""
