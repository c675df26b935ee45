"""The first half of generation: checks the arguments of ``generate`` / ``generate_stream``
(their keyword options are defined once, by :class:`GenerateOptions`), pads the prompts to a
shape bucket, builds the engine's static spec (the target, the proposer, the acceptance rule,
the verify length) and runs ``engine.prefill``. ``prepare_decode`` is this, for benchmarks that
drive ``engine.decode`` themselves; it never starts a measurement (an adaptive block size needs
its cost table passed in: ``decoding.costs.cost_table``)."""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax import parallel
from dflash_jax.verification import adaptive as adaptive_mod
from dflash_jax.decoding import engine
from dflash_jax.verification.adaptive import ADAPTIVE, Adaptive
from dflash_jax.verification.sampling import SamplingParams
from dflash_jax.verification.acceptance import MATCH, REJECTION
from dflash_jax.verification.policy import FixedVerify
from dflash_jax.verification.tree import TreeVerify, check_tree_memory
from dflash_jax import methods
from dflash_jax.models.handles import Target
from dflash_jax.nn.attention import check_attention_impl
from dflash_jax.proposers import Proposer


@dataclasses.dataclass(frozen=True)
class GenerateOptions:
    """How a generation decodes: the keyword options of :func:`generate`,
    :func:`generate_stream` and :func:`prepare_decode` (besides ``drafter``), defined once.

    temperature / top_k / top_p: 0 = greedy; otherwise sampling with these filters (applied
      identically to draft and target).
    stop_token_ids: ids that end a row (one id, one list for all rows, or one list per row).
    seed: PRNG seed.
    block_size: speculative block size (default: the drafter's training block size).
    verify: the verify policy (``docs/methods.md``): "fixed" (the default: the whole block),
      "adaptive" or ``Adaptive(per_row=..., lengths=..., cost_table=..., splits=...)`` (verify
      only the first L rows per iteration, L chosen from the drafter's confidence and measured
      costs, per batch or per row; ``verification.adaptive``; the chosen lengths are in
      ``GenerateResult.verify_lengths``), or ``TreeVerify(nodes=N, topk=K)`` (a tree of N
      nodes per iteration, root included, the proposer's K most likely tokens per depth grown
      best-first, depth up to ``block_size - 1``; ``verification.tree``).
    block_size="adaptive", verify_lengths, cost_table, verify_per_row, row_splits, tree,
      tree_topk: deprecated spellings of ``verify`` (``block_size="adaptive"`` with the next
      four is ``Adaptive(per_row, lengths, cost_table, splits)``, ``tree=N, tree_topk=K`` is
      ``TreeVerify(N, K)``); they keep working and warn.
    num_denoise_steps: drafter passes per draft (ablation knob; 1 as in the paper).
    sampled_draft: sample the draft from the drafter's distribution and use rejection
      sampling, instead of the greedy draft the paper uses (both are lossless).
    proposer: advanced: a proposer (``dflash_jax.proposers.Proposer``) used instead of the
      drafter's DFlash proposer; its block size is ``block_size`` (default: the drafter's).
    attention_impl: "xla" (default) or "pallas" (``kernels.block_attention``; interpreted,
      slowly, when not on a GPU) for attention through the KV caches.
    pad_to: (prompt width, cache length) to pad to at least, so that calls with different
      prompts reuse one compiled program (benchmarks); default: the smallest bucket.
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    stop_token_ids: Any = ()
    seed: int = 0
    block_size: int | str | None = None
    verify_lengths: tuple[int, ...] | None = None
    cost_table: Mapping[int, float] | None = None
    verify_per_row: bool = False
    row_splits: tuple[int, ...] | None = None
    num_denoise_steps: int = 1
    sampled_draft: bool = False
    proposer: Proposer | None = None
    attention_impl: str = "xla"
    pad_to: tuple[int, int] | None = None
    tree: int | None = None
    tree_topk: int = 4
    verify: Any = None

    @classmethod
    def from_keywords(cls, function: str, options: Mapping[str, Any]) -> "GenerateOptions":
        """The options given to ``function`` as keywords; an unknown keyword is the
        ``TypeError`` Python raises for any function, naming the options there are."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in options if k not in names]
        if unknown:
            raise TypeError(f"{function}() got an unexpected keyword argument {unknown[0]!r} (the "
                            f"options, fields of GenerateOptions: {', '.join(names)})")
        return cls(**options)


def per_row_plan(target: Target, batch: int, block_size: int, request: Adaptive
                 ) -> tuple[tuple[int, int], tuple[int, ...]]:
    """Per-row verification's (short, long) lengths and splits for ``batch`` prompts (the
    splits count one data shard's rows on a mesh), from the request's ``lengths`` and
    ``splits`` (``verification.adaptive``)."""
    data = 1 if target.mesh is None else parallel.mesh_axis_sizes(target.mesh)[parallel.DATA]
    return (adaptive_mod.per_row_lengths(block_size, request.lengths),
            adaptive_mod.row_splits(max(batch // data, 1), request.splits))


_DEPRECATED = {"verify_lengths": None, "cost_table": None, "verify_per_row": False, "row_splits": None,
               "tree": None, "tree_topk": 4}
"""The deprecated spellings of ``verify`` and their defaults (``block_size="adaptive"`` too)."""


@dataclasses.dataclass(frozen=True)
class VerifyRequest:
    """The verify policy asked for: ``request`` (``FixedVerify``, ``Adaptive`` or
    ``TreeVerify``) and how the call spelled it (``shown``, for refusals)."""

    request: Any
    shown: str


def verify_request(opt: GenerateOptions, warn: bool = True) -> VerifyRequest:
    """The verify policy ``opt`` asks for: its ``verify``, or the deprecated keywords folded into
    one (a ``DeprecationWarning`` when ``warn``); a wrong value or a mix of the two spellings is
    a ``ValueError`` naming the fix."""
    old = [name for name, default in _DEPRECATED.items() if getattr(opt, name) != default]
    adaptive = opt.block_size == ADAPTIVE
    if opt.verify is not None:
        if old or adaptive:
            given = ", ".join(old + (["block_size='adaptive'"] if adaptive else []))
            raise ValueError(f"verify={opt.verify!r} with {given}: the verify policy is one value, "
                             "pass verify= alone (the others are its deprecated spellings)")
        return VerifyRequest(_as_request(opt.verify), f"verify={opt.verify!r}")
    if opt.row_splits is not None and not opt.verify_per_row:
        raise ValueError("row_splits belongs to per-row verification: pass verify_per_row=True (and "
                         f"block_size={ADAPTIVE!r}) with it")
    if not adaptive and (opt.verify_lengths is not None or opt.cost_table is not None or opt.verify_per_row):
        raise ValueError("verify_lengths, cost_table and verify_per_row belong to the adaptive block size: pass "
                         f"block_size={ADAPTIVE!r} with them (got block_size={opt.block_size!r})")
    if opt.tree is None and opt.tree_topk != 4:
        raise ValueError(f"tree_topk={opt.tree_topk!r} belongs to tree verification: pass "
                         "tree=N (nodes per iteration) with it")
    if warn and (old or adaptive):
        warnings.warn("generate's block_size='adaptive', verify_lengths, cost_table, verify_per_row, "
                      "row_splits, tree and tree_topk are deprecated: pass verify='adaptive', "
                      "verify=Adaptive(per_row, lengths, cost_table, splits) or verify=TreeVerify(nodes, "
                      "topk) (docs/methods.md)", DeprecationWarning, stacklevel=4)
    if opt.tree is not None:
        return VerifyRequest(_tree_request(opt, adaptive), f"tree={opt.tree}")
    if adaptive:
        return VerifyRequest(Adaptive(bool(opt.verify_per_row), opt.verify_lengths, opt.cost_table,
                                      opt.row_splits), f"block_size={ADAPTIVE!r}")
    return VerifyRequest(FixedVerify(), "verify='fixed'")


def _as_request(value):
    """``verify=``'s value as a request: "fixed", "adaptive", or a policy object."""
    if isinstance(value, str) and value.strip().lower() in ("fixed", ADAPTIVE):
        return FixedVerify() if value.strip().lower() == "fixed" else Adaptive()
    if isinstance(value, (FixedVerify, Adaptive, TreeVerify)):
        return value
    raise ValueError(f"verify={value!r}: give 'fixed', 'adaptive', dflash_jax.Adaptive(per_row=..., "
                     "lengths=..., cost_table=...) or dflash_jax.TreeVerify(nodes=N, topk=K)")


def without_deprecated(opt: GenerateOptions, request) -> GenerateOptions:
    """``opt`` with its verify policy as ``verify=request`` and the deprecated keywords reset."""
    return dataclasses.replace(opt, verify=request, **_DEPRECATED,
                               block_size=None if opt.block_size == ADAPTIVE else opt.block_size)


# ---------------------------------------------------------------------------- input checks
def _unpack_encoding(prompts) -> list[list[int]]:
    """Token-id rows of what a tokenizer returns (``tokenizer(...)``,
    ``apply_chat_template(..., tokenize=True)``: a ``BatchEncoding`` or dict with
    ``input_ids``): a flat list is one prompt; padding is removed with ``attention_mask``."""
    if "input_ids" not in prompts:
        raise ValueError("prompts is a mapping without 'input_ids': pass token-id lists, or what "
                         "the tokenizer returns (tokenizer(text) / apply_chat_template(..., tokenize=True))")
    as_list = lambda x: x.tolist() if hasattr(x, "tolist") else x  # numpy / torch arrays
    ids, mask = as_list(prompts["input_ids"]), prompts.get("attention_mask")
    mask = as_list(mask) if mask is not None else None
    if len(ids) and isinstance(ids[0], int):  # one prompt
        ids, mask = [ids], ([mask] if mask is not None else None)
    if mask is None:
        return [list(r) for r in ids]
    return [[t for t, m in zip(r, mr) if m] for r, mr in zip(ids, mask)]


def _as_prompt_list(prompts, vocab_size: int) -> list[np.ndarray]:
    if isinstance(prompts, Mapping):  # BatchEncoding is a Mapping too
        prompts = _unpack_encoding(prompts)
    if isinstance(prompts, (np.ndarray, jax.Array)):
        arr = np.asarray(prompts)
        if arr.ndim != 2:
            raise ValueError(
                f"a prompt array must have rank 2 [batch, length], got shape {arr.shape}; "
                "for one prompt pass [token_ids]")
        prompts = list(arr)
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise ValueError("prompts must be a list of token-id lists (one list per prompt)")
    if len(prompts) == 0:
        raise ValueError("prompts is empty: pass at least one prompt")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, (str, bytes)):
            raise ValueError(f"prompt {i} is a string: tokenize it first (target.tokenizer.encode)")
        if isinstance(p, (int, np.integer)):
            raise ValueError("prompts must be a list of token-id lists; for one prompt pass [token_ids]")
        arr = np.asarray(p)
        if arr.ndim != 1:
            raise ValueError(f"prompt {i} must be a 1-D sequence of token ids, got shape {arr.shape}")
        if arr.size == 0:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"prompt {i} must hold integer token ids, got dtype {arr.dtype}")
        if arr.min() < 0 or arr.max() >= vocab_size:
            raise ValueError(
                f"prompt {i} has token ids outside the vocabulary [0, {vocab_size}): "
                f"min {arr.min()}, max {arr.max()}")
        out.append(arr.astype(np.int32))
    return out


def _per_row(value, batch: int, name: str) -> list:
    if isinstance(value, (list, tuple, np.ndarray)) and len(value) and not np.isscalar(value):
        if len(value) != batch:
            raise ValueError(f"{name} has {len(value)} entries for {batch} prompts")
        return list(value)
    return [value] * batch


def _stop_array(stop_token_ids, batch: int, vocab_size: int) -> np.ndarray:
    """int32[B, S] stop ids, -1 padded; accepts one id, one shared list or one list per row."""
    if isinstance(stop_token_ids, (int, np.integer)) and not isinstance(stop_token_ids, bool):
        stop_token_ids = [stop_token_ids]
    ids = list(stop_token_ids) if stop_token_ids is not None else []
    per_row = ids and all(isinstance(x, (list, tuple, np.ndarray)) for x in ids)
    rows = [list(x) for x in ids] if per_row else [ids] * batch
    if len(rows) != batch:
        raise ValueError(f"stop_token_ids has {len(rows)} per-row lists for {batch} prompts")
    width = max(1, max(len(r) for r in rows))
    out = np.full((batch, width), -1, np.int32)
    for b, r in enumerate(rows):
        for j, t in enumerate(r):
            if not isinstance(t, (int, np.integer)) or not 0 <= t < vocab_size:
                raise ValueError(f"stop token id {t!r} is not an id in the vocabulary [0, {vocab_size})")
            out[b, j] = t
    return out


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def plan_lengths(target: Target, prompt_lens: Sequence[int], max_new: Sequence[int],
                 extra: int = 0, pad_to: tuple[int, int] | None = None) -> tuple[int, int]:
    """Padded prompt width and cache length (bucketed so shapes, and compiles, repeat).

    ``extra`` reserves slots past the last token (the speculative block). ``pad_to`` =
    (min prompt width, min cache length) makes calls with different prompts share one
    compiled program. Raises ValueError when a row's prompt + budget exceeds the target's
    ``max_len``.
    """
    need = [p + m for p, m in zip(prompt_lens, max_new)]
    worst = int(np.argmax(need))
    if need[worst] > target.max_len:
        raise ValueError(
            f"prompt {worst} has {prompt_lens[worst]} tokens and max_new_tokens is "
            f"{max_new[worst]}: {need[worst]} > the cache length max_len={target.max_len}. "
            "Shorten the prompt, lower max_new_tokens, or load the target with a larger max_len "
            "(load_target(..., max_len=N); --max-len N on the command line).")
    cache_len = min(round_up(max(need) + extra, 64), target.max_len + extra)
    prompt_width = min(round_up(max(prompt_lens), 16), cache_len)
    if pad_to is not None:
        width, length = (int(x) for x in pad_to)
        if width < 1 or length < width + extra:
            raise ValueError(f"pad_to=(prompt width {width}, cache length {length}) must have a "
                             f"positive width and a cache length >= width + block ({extra})")
        prompt_width, cache_len = max(prompt_width, width), max(cache_len, length)
    return prompt_width, cache_len


@dataclasses.dataclass
class PreparedDecode:
    """A validated, prefilled generation, ready for ``engine.decode``."""

    spec: engine.EngineSpec
    drafter_params: Any
    max_new: jax.Array
    stop_ids: jax.Array
    state: engine.DecodeState
    stops: np.ndarray
    prompt_lengths: list[int]
    prefill_time_s: float


def prepare_decode(target: Target, prompts, max_new_tokens, *, drafter=None,
                   **options) -> PreparedDecode:
    """Checks the arguments of :func:`generate` (same meaning; ``options`` are the fields of
    :class:`GenerateOptions`) and runs the prefill; the step benchmark uses it to get a
    realistic loop state."""
    return _prepare(target, prompts, max_new_tokens, drafter,
                    GenerateOptions.from_keywords("prepare_decode", options))


def _prepare(target: Target, prompts, max_new_tokens, drafter,
             opt: GenerateOptions) -> PreparedDecode:
    cfg = target.config
    rows = _as_prompt_list(prompts, cfg.vocab_size)
    B = len(rows)
    budgets = _per_row(max_new_tokens, B, "max_new_tokens")
    for m in budgets:
        if not isinstance(m, (int, np.integer)) or isinstance(m, bool) or m < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {m!r}")
    sampling = SamplingParams(float(opt.temperature), opt.top_k, opt.top_p)
    stops = _stop_array(opt.stop_token_ids, B, cfg.vocab_size)
    if isinstance(opt.block_size, str) and opt.block_size != ADAPTIVE:
        raise ValueError(f"block_size must be a positive integer or {ADAPTIVE!r} (deprecated: "
                         f"verify='adaptive'), got {opt.block_size!r}")
    asked = verify_request(opt)
    request = asked.request
    opt = without_deprecated(opt, request)
    block_size, num_denoise_steps = opt.block_size, opt.num_denoise_steps
    if drafter is None and opt.proposer is not None:  # a custom proposer alone
        if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size < 2:
            raise ValueError(f"a proposer without a drafter needs block_size, an integer >= 2 "
                             f"(got {block_size!r})")
        bs, dparams = int(block_size), None
    elif drafter is None:
        if block_size not in (None, 1):
            raise ValueError(f"block_size={block_size!r} needs a drafter (generate(..., drafter=...))")
        if isinstance(request, TreeVerify):
            raise ValueError(f"{asked.shown} needs a drafter (or a proposer): autoregressive decoding "
                             "drafts nothing")
        if isinstance(request, Adaptive):
            raise ValueError(f"{asked.shown} needs a drafter (generate(..., drafter=...))")
        bs, dparams = 1, None
    else:
        method = methods.method_of(drafter)
        wanted = ((request.name, asked.shown), ("sampled_draft", "sampled_draft=True" if opt.sampled_draft else None))
        for what, shown in wanted:  # what the method declares it does not do
            if shown is not None and what in method.unsupported:
                raise ValueError(f"{shown}: {method.unsupported[what]}")
        drafter.config.check_target(cfg)
        if drafter.mesh is not target.mesh and drafter.mesh != target.mesh:
            where = lambda m: "one device" if m is None else f"mesh {dict(zip(m.axis_names, m.devices.shape))}"
            raise ValueError(f"the drafter is placed on {where(drafter.mesh)} and the target on "
                             f"{where(target.mesh)}: load the drafter with load_drafter(path, "
                             "target), which places it on the target's mesh")
        if block_size is not None and (
                isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer))):
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        trained = method.default_block_size(drafter)
        bs = trained if block_size is None else int(block_size)
        if bs < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if bs > target.max_len:
            raise ValueError(f"block_size={bs} is larger than the target's cache (max_len="
                             f"{target.max_len}): a block must fit in the cache; use a block size "
                             f"up to {target.max_len} (the drafter was trained with "
                             f"{trained})")
        method.check_options(opt, bs)
        dparams = method.proposer_params(drafter)
    if int(num_denoise_steps) != num_denoise_steps or num_denoise_steps < 1:
        raise ValueError(f"num_denoise_steps must be a positive integer, got {num_denoise_steps!r}")
    if num_denoise_steps > 1 and opt.sampled_draft:
        raise ValueError("sampled_draft=True supports num_denoise_steps=1 only (the proposal "
                         "distribution of a multi-step draft is not defined); use the greedy draft")
    if target.mesh is not None:
        data = parallel.mesh_axis_sizes(target.mesh)[parallel.DATA]
        if B % data:
            raise ValueError(f"{B} prompts cannot be split over the mesh's data={data} shards: "
                             f"pass a multiple of {data} prompts (or build the mesh with "
                             f"data dividing {B})")
    verify = _policy(target, request, asked.shown, opt, bs, B)
    lens = [len(r) for r in rows]
    extra = verify.slots(bs)  # the cache slots one verify writes
    width, cache_len = plan_lengths(target, lens, budgets, extra=extra, pad_to=opt.pad_to)
    proposer = None
    if bs > 1:
        if opt.proposer is not None:
            if not isinstance(opt.proposer, Proposer):
                raise ValueError(f"proposer must be a dflash_jax.proposers.Proposer, got "
                                 f"{type(opt.proposer).__name__}")
            proposer = opt.proposer
        else:
            proposer = method.proposer(drafter, bs, opt, sampling.greedy)
    spec = engine.EngineSpec(
        target=cfg, proposer=proposer, block_size=bs, sampling=sampling,
        acceptance=REJECTION if proposer is not None and proposer.sampled else MATCH,
        verify=verify, out_len=round_up(max(budgets), 16),
        attention_impl=check_attention_impl(opt.attention_impl), mesh=target.mesh)
    check_tree_memory(spec, B, target.params)
    tokens = np.zeros((B, width), np.int32)
    for b, r in enumerate(rows):
        tokens[b, :len(r)] = r
    inputs = _on_mesh(target.mesh, tokens=tokens, lens=np.asarray(lens, np.int32),
                      max_new=np.asarray(budgets, np.int32), stop_ids=stops, seed=opt.seed)
    max_new, stop_ids = inputs["max_new"], inputs["stop_ids"]
    t0 = time.perf_counter()
    state = engine.prefill(target.params, dparams, inputs["tokens"], inputs["lens"],
                           max_new, stop_ids, inputs["key"], spec=spec, cache_len=cache_len)
    jax.block_until_ready(state.out)
    return PreparedDecode(spec, dparams, max_new, stop_ids, state, stops, lens,
                          time.perf_counter() - t0)


def _tree_request(opt: GenerateOptions, adaptive: bool) -> TreeVerify:
    """The tree verify policy of the deprecated ``tree`` / ``tree_topk``, checked."""
    for name in ("tree", "tree_topk"):
        v = getattr(opt, name)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{name} must be an integer, got {v!r}")
    if adaptive:
        raise ValueError(f"tree=N and block_size={ADAPTIVE!r} are two verify policies: choose one "
                         "(a tree's size is its node budget)")
    if opt.tree < 2:
        raise ValueError(f"tree={opt.tree}: a tree needs at least 2 nodes (the anchor and one "
                         "draft); the chain is the default (tree=None)")
    return TreeVerify(int(opt.tree), int(opt.tree_topk))


def _policy(target: Target, request, shown: str, opt: GenerateOptions, bs: int, batch: int):
    """The engine's verify policy for ``request`` (``verify_request``) at block size ``bs``:
    a tree or the fixed block as asked (checked), an adaptive request with its lengths,
    splits and cost table checked (the table given or measured by ``generate``)."""
    if isinstance(request, TreeVerify):
        if opt.sampled_draft:
            raise ValueError(f"{shown} drafts the drafter's top-k tokens at each depth (deterministic "
                             "drafts): it cannot be combined with sampled_draft=True")
        return request
    if not isinstance(request, Adaptive):
        return request
    if request.per_row:
        lengths, splits = per_row_plan(target, batch, bs, request)
        if request.cost_table is None:
            raise ValueError(f"per-row verification needs a cost_table here ({{split: seconds per iteration}}, "
                             f"splits {list(splits)}; dflash_jax.decoding.costs.cost_table measures and "
                             "caches one; generate and generate_stream do that themselves)")
        return adaptive_mod.AdaptiveVerify(
            lengths, adaptive_mod.check_cost_table(request.cost_table, splits, "split"), splits)
    lengths = adaptive_mod.verify_lengths(bs, request.lengths)
    if request.cost_table is None:
        raise ValueError(f"{shown} needs a cost_table here ({{verify length: seconds per iteration}}; "
                         "dflash_jax.decoding.costs.cost_table measures and caches one; generate and "
                         "generate_stream do that themselves)")
    return adaptive_mod.AdaptiveVerify(lengths, adaptive_mod.check_cost_table(request.cost_table, lengths))


def _on_mesh(mesh, *, seed: int, **rows: np.ndarray) -> dict:
    """The engine's inputs as device arrays: one device's (``mesh`` None), or global arrays
    on the mesh with rows split over ``data`` and the PRNG key replicated (built by every
    process from the same host values, so this holds across hosts too)."""
    key = jax.random.key(seed)
    if mesh is None:
        return {"key": key, **{name: jnp.asarray(x) for name, x in rows.items()}}
    from jax.sharding import NamedSharding, PartitionSpec as P

    out = {name: parallel.rules.place(x, NamedSharding(mesh, P(parallel.DATA, *[None] * (x.ndim - 1))))
           for name, x in rows.items()}
    key_data = parallel.rules.place(np.asarray(jax.random.key_data(key)), NamedSharding(mesh, P()))
    out["key"] = jax.random.wrap_key_data(key_data, impl=jax.random.key_impl(key))
    return out
