"""The drafting-method interface, :class:`DraftingMethod` (what the registry in
``dflash_jax.methods`` maps a drafter checkpoint's ``architectures`` to; ``docs/methods.md``)."""

from __future__ import annotations

import importlib
from typing import Any, Mapping


class DraftingMethod:
    """One drafting method. Subclass it, set :attr:`name` and :attr:`architectures`, implement
    the methods that raise ``NotImplementedError`` here, give the method's drafter handle class a
    ``method_name`` attribute equal to :attr:`name`, and register an instance
    (``dflash_jax.methods.register``, one line in ``dflash_jax/methods/builtin.py``).

    Loading and saving (``load_drafter`` / ``save_drafter``): :meth:`load`, :meth:`save`.
    Generation (``decoding.prepare``): :attr:`unsupported`, :meth:`default_block_size`,
    :meth:`check_options`, :meth:`proposer`, :meth:`proposer_params`, :attr:`automatic_adaptive`. Reports:
    :attr:`label`.
    """

    name: str = ""
    """The method's short name (registry key, messages)."""

    architectures: tuple[str, ...] = ()
    """The ``config.json`` ``architectures`` values that name this method's checkpoints."""

    label: str = ""
    """The method's name in reports, tables and legends (e.g. ``"DFlash"``)."""

    automatic_adaptive: bool = False
    """Whether ``generate`` measures the adaptive verify length's cost table itself for this
    method's drafters (``decoding.costs``) and ``bench`` reports an adaptive column; without it
    ``verify=Adaptive(...)`` takes an explicit ``cost_table``."""

    unsupported: Mapping[str, str] = {}
    """What the method does not do, each with the reason ``generate`` gives, refused before
    anything compiles: a verify policy's name (``verification.policy.VerifyPolicy.name``:
    ``"tree"``, ``"adaptive"``) or ``"sampled_draft"`` (``sampled_draft=True``). Absent:
    supported."""

    training_module: str | None = None
    """The module with the method's training objective and its part of the ``train`` command, if
    it trains there: ``TRAINER`` (its :class:`~dflash_jax.training.trainer.Trainer` subclass),
    ``TRAIN_OPTIONS`` ({(dest, option): value when not given} of its own options),
    ``IGNORED_SETTINGS`` (the ``TrainConfig`` fields it does not read), ``add_train_arguments(p)``
    and ``train_from_args(args, train_config)``. Imported when it is needed (it sits above the
    trainer)."""

    @property
    def trainer(self):
        """The method's trainer class (its training module's ``TRAINER``)."""
        if not self.training_module:
            raise ValueError(f"the drafting method {self.name!r} does not train here")
        return importlib.import_module(self.training_module).TRAINER

    handle_exports: str | None = None
    """A module whose ``__all__`` names ``dflash_jax.models.handles`` still offers for this method
    (names it had there before the method packages), or None."""

    shipped_name: str | None = None
    """The command-line name of a drafter of this method shipped in the package (e.g.
    ``embedded-<method>``), if any; its directory is :meth:`shipped_dir`."""

    profile_settings: tuple = ()
    """The runs ``iteration-profile`` compares for this method: ``(label, settings)`` pairs,
    ``settings`` with ``block_size``, ``tree`` and ``tree_topk`` where they differ from the
    drafter's chain; the label follows :attr:`label` in the tables."""

    names_help: str = ""
    """For a method whose drafters ``iteration-profile`` (``--<name>-drafter``) and the
    experiments name on command lines (:meth:`by_name`): what a name may be. Empty: none."""

    def by_name(self, name: str, target, dtype=None):
        """The drafter a command line names ``name`` (:attr:`names_help`)."""
        raise NotImplementedError(self._missing("by_name"))

    def profile_parts(self, target, drafter, pre, tparams, n: int, repeats: int, in_loop) -> dict:
        """Seconds per call of the parts of this method's draft at the loop state of ``pre``
        (``decoding.prepare.PreparedDecode``; ``tparams``: the target's parameters as the loop
        holds them), each timed by ``in_loop(fn, args, n, repeats, carried=None)``
        (``bench.iteration_profile.in_loop``); keys start with ``"draft"``. {}: not profiled."""
        return {}

    def claims(self, d: Mapping[str, Any]) -> bool:
        """Whether a ``config.json`` dict whose ``architectures`` name no registered method is
        this method's by its fields (checkpoints written before their layout named a class, or
        under another class name); the method's config reader then refuses what it does not
        implement, naming the field."""
        return False

    def shipped_dir(self) -> str | None:
        """The directory of the drafter :attr:`shipped_name` names."""
        return None

    # ------------------------------------------------------------------ checkpoints
    def load(self, path: str, target, dtype=None):
        """The drafter handle in the checkpoint directory ``path``, checked against the loaded
        ``target`` (its config and mesh); ``dtype`` defaults to the target's."""
        raise NotImplementedError(self._missing("load"))

    def save(self, drafter, path) -> None:
        """Writes ``drafter`` to the directory ``path`` in the method's released layout."""
        raise NotImplementedError(self._missing("save"))

    def config_from_hf(self, d: Mapping[str, Any]):
        """The method's drafter config from a ``config.json`` dict (a training run records
        its drafter's so)."""
        raise NotImplementedError(self._missing("config_from_hf"))

    def from_run(self, run_dir: str, record: Mapping[str, Any], config, params):
        """The drafter handle of a training run's ``config`` and ``params`` (``export``;
        ``record``: the run's run.json, for what else the run keeps)."""
        raise NotImplementedError(self._missing("from_run"))

    # ------------------------------------------------------------------ generation
    def default_block_size(self, drafter) -> int:
        """The block ``generate`` uses when none is given (the anchor and the drafted rows)."""
        raise NotImplementedError(self._missing("default_block_size"))

    def check_options(self, opt, block_size: int) -> None:
        """Refuses, with the reason, generation options (``decoding.prepare.GenerateOptions``)
        the method does not take at this block size."""

    def proposer(self, drafter, block_size: int, opt, greedy: bool):
        """The ``proposers.Proposer`` that drafts for ``drafter`` (``greedy``: the target
        samples nothing)."""
        raise NotImplementedError(self._missing("proposer"))

    def proposer_params(self, drafter) -> Any:
        """The pytree the engine hands :meth:`proposer`'s proposer (default: the parameters)."""
        return drafter.params

    def with_depth(self, drafter, layers: int, target):
        """A drafter like ``drafter`` (its block, taps and the rest) with ``layers`` layers and
        random weights, for ``iteration-profile --depths`` (a part's time does not depend on the
        weights). A method whose drafters have no depth to vary leaves it unimplemented."""
        raise NotImplementedError(self._missing("drafters of another depth"))

    # ------------------------------------------------------------------ size model
    def num_params(self, config) -> int:
        """The drafter's own parameters (what the target lends it, its embedding or LM head,
        not counted) for a drafter config of this method."""
        raise NotImplementedError(self._missing("num_params"))

    def draft_costs(self, config, target_config, block_size: int, context: int, *, tree_topk: int | None = None,
                    ctx_rows: int | None = None, batch: int = 1, weight_bytes: int = 2,
                    kv_bytes: int = 2) -> list:
        """What one iteration's draft costs, cut into components (``dflash_jax.sizes.Cost``: FLOPs,
        bytes by kind): a drafter of ``config`` for a target of ``target_config`` drafting a
        block of ``block_size`` rows (the anchor included) at ``context`` cached positions,
        ``tree_topk``: the tokens per depth of a tree draft (None: a chain), ``ctx_rows``: the
        committed rows it takes in (default: ``block_size``, every row of the verified block),
        ``batch`` rows, ``weight_bytes`` / ``kv_bytes`` per value. The rooflines time it."""
        raise NotImplementedError(self._missing("draft_costs"))

    def draft_flops(self, config, target_config, block_size: int, context: int, **kw) -> float:
        """The FLOPs of :meth:`draft_costs`."""
        return sum(c.flops for c in self.draft_costs(config, target_config, block_size, context, **kw))

    def draft_bytes(self, config, target_config, block_size: int, context: int, **kw) -> float:
        """The bytes through memory of :meth:`draft_costs` (weights, K/V, activations)."""
        return sum(c.bytes for c in self.draft_costs(config, target_config, block_size, context, **kw))

    def _missing(self, what: str) -> str:
        return f"the drafting method {self.name!r} does not implement {what}"

    def __repr__(self) -> str:
        return f"<drafting method {self.name}>"
