"""Generation as the library user calls it: ``generate`` and ``generate_stream`` check the
arguments and run the prefill (``decoding.prepare``), run ``engine.decode`` and turn the device
state into a :class:`GenerateResult` (tokens, finish reasons, acceptance statistics, timings) or
:class:`StreamChunk` s. With ``verify="adaptive"`` and no cost table they first get one
(``decoding.costs``: measured once per device and cached). ``dflash_jax.generate`` /
``dflash_jax.generate_stream`` are these functions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Any

import jax
import numpy as np

from dflash_jax import methods, metrics
from dflash_jax.decoding import costs, engine
from dflash_jax.decoding.prepare import (GenerateOptions, _as_prompt_list, _prepare, per_row_plan,
                                         verify_request)
from dflash_jax.verification.adaptive import Adaptive, verify_lengths
from dflash_jax.models.handles import Target


@dataclasses.dataclass
class GenerateResult:
    """What ``generate`` returns.

    sequences: per prompt, the generated token ids only (a stop token, when hit, is last).
    finish_reasons: per prompt, "stop" (hit a stop token) or "length" (used its budget).
    acceptance_lengths: per prompt, the acceptance length of every iteration (accepted draft
      tokens + the bonus, so 1..block_size; all 1 for autoregressive decoding).
    verify_lengths: per prompt, the block rows the target verified in every iteration (the
      block size, or with ``verify="adaptive"`` the length chosen that iteration).
    prefill_time_s / decode_time_s: wall time of the two device stages. The first call with
      new shapes (or options) compiles the stage's program inside that time; benchmarks warm
      up first.
    num_steps: loop iterations (target forward passes after prefill) of the longest row.
    prefill_compile_s / decode_compile_s: the part of prefill_time_s / decode_time_s that
      tracing, lowering and compiling that stage's program took in this call (0.0: the
      program was already compiled); :attr:`includes_compilation` says whether either is.
    """

    sequences: list[list[int]]
    finish_reasons: list[str]
    prompt_lengths: list[int]
    acceptance_lengths: list[list[int]]
    block_size: int
    prefill_time_s: float
    decode_time_s: float
    num_steps: int
    verify_lengths: list[list[int]] = dataclasses.field(default_factory=list)
    prefill_compile_s: float = 0.0
    decode_compile_s: float = 0.0

    @property
    def includes_compilation(self) -> bool:
        """Whether this call compiled a program (first call with these shapes): its times
        then measure compilation too, not decoding speed."""
        return self.prefill_compile_s > 0 or self.decode_compile_s > 0

    @property
    def timing_note(self) -> str:
        """What the times measure, in one line (``summary()`` carries it)."""
        if not self.includes_compilation:
            return "no compilation in these times (the programs were compiled by an earlier call)"
        parts = [f"{name} includes {s:.2f} s of compilation" for name, s in
                 (("prefill_time_s", self.prefill_compile_s), ("decode_time_s", self.decode_compile_s)) if s > 0]
        return ("; ".join(parts) + " (first call with these shapes): call again with the same shapes, "
                "or warm up, to time decoding")

    @property
    def num_generated(self) -> list[int]:
        return [len(s) for s in self.sequences]

    @property
    def tau(self) -> float:
        """Mean acceptance length: per row, then over rows (docs/method.md section 6; ``metrics.tau``)."""
        return metrics.tau(self.acceptance_lengths)

    @property
    def acceptance_histogram(self) -> np.ndarray:
        """Counts of acceptance lengths 1..block_size (index 0 = length 1)."""
        return metrics.acceptance_histogram(self.acceptance_lengths, self.block_size)

    @property
    def position_acceptance_rate(self) -> np.ndarray:
        """float[block_size - 1]: for draft position i = 1..bs-1, the fraction of iterations
        whose draft token i was accepted (acceptance length > i; ``metrics.position_acceptance``)."""
        return metrics.position_acceptance(self.acceptance_lengths, self.block_size)

    def summary(self) -> dict:
        return {"tau": self.tau, "histogram": self.acceptance_histogram.tolist(),
                "verify_lengths": self.verify_lengths,
                "position_acceptance_rate": self.position_acceptance_rate.tolist(),
                "num_generated": self.num_generated, "num_steps": self.num_steps,
                "prefill_time_s": self.prefill_time_s, "decode_time_s": self.decode_time_s,
                "includes_compilation": self.includes_compilation, "timing": self.timing_note}


@dataclasses.dataclass
class StreamChunk:
    """Tokens committed since the previous chunk (per prompt) and which rows are finished."""

    tokens: list[list[int]]
    done: list[bool]


def _with_cost_table(target: Target, prompts, drafter, opt: GenerateOptions) -> GenerateOptions:
    """``opt`` with an adaptive verify request's cost table (``verify=`` or its deprecated
    spelling): the given one, else the one measured (and cached) on this device for this pair
    and batch (``costs.cost_table``). Run before the arguments are prepared, so that preparing
    never starts a benchmark; options that cannot be measured are left for :func:`_prepare` to
    refuse."""
    request = verify_request(opt, warn=False).request  # _prepare warns, naming the spelling used
    if (not isinstance(request, Adaptive) or request.cost_table is not None or drafter is None
            or not methods.method_of(drafter).automatic_adaptive):
        return opt
    batch = len(_as_prompt_list(prompts, target.config.vocab_size))
    bs = methods.method_of(drafter).default_block_size(drafter)  # the verify width (DSpark's: its rows + 1)
    if request.per_row:
        lengths, splits = per_row_plan(target, batch, bs, request)
        table = costs.cost_table(target, drafter, lengths, batch, splits=splits)
    else:
        table = costs.cost_table(target, drafter, verify_lengths(bs, request.lengths), batch)
    if opt.verify is None:  # the deprecated spelling, kept
        return dataclasses.replace(opt, cost_table=table)
    return dataclasses.replace(opt, verify=dataclasses.replace(request, cost_table=table))


# Compilation inside a call's timed stages, seen through jax.monitoring: jax reports the time
# of tracing, lowering and XLA compilation (a persistent-cache load included) of each program
# it builds, synchronously, in the thread that asked, with the jitted function's name.
_COMPILE_EVENTS = frozenset(("/jax/core/compile/jaxpr_trace_duration",
                             "/jax/core/compile/jaxpr_to_mlir_module_duration",
                             "/jax/core/compile/backend_compile_duration"))
_watch = threading.local()


def _on_duration(event: str, seconds: float, **info) -> None:
    seen = getattr(_watch, "seen", None)
    if seen is not None and event in _COMPILE_EVENTS:
        name = str(info.get("fun_name", ""))
        seen.append((name[4:-1] if name.startswith("jit(") and name.endswith(")") else name, seconds))


_listener_lock = threading.Lock()
_listening = False


def _listen() -> None:
    """Registers :func:`_on_duration` with jax.monitoring once, at the first timed call (not at
    import: importing the library installs no process-wide hook)."""
    global _listening
    with _listener_lock:
        if not _listening:
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            _listening = True


@contextlib.contextmanager
def _compile_seconds(program):
    """``with _compile_seconds(engine.decode) as spent:`` -- after the block, ``spent[0]`` is
    the seconds this thread spent building ``program`` (a jitted function) inside it."""
    _listen()
    outer, _watch.seen = getattr(_watch, "seen", None), []
    spent = [0.0]
    try:
        yield spent
    finally:
        seen, _watch.seen = _watch.seen, outer
        if outer is not None:
            outer.extend(seen)
        spent[0] = float(sum(s for name, s in seen if name == program.__name__))


def _fetch(tree, mesh):
    """Host (numpy) copies of result arrays; on a mesh that spans processes, every process
    gathers the rows of all of them."""
    if mesh is not None and jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return jax.tree_util.tree_map(
            lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), tree)
    return jax.device_get(tree)


def generate(target: Target, prompts, max_new_tokens, *, drafter: Any = None,
             **options) -> GenerateResult:
    """Generates continuations of a batch of (ragged) token-id prompts, all on device.

    Args:
      target: a loaded :class:`Target`.
      prompts: list of token-id lists (lengths may differ), or an int array [B, T].
      max_new_tokens: new-token budget, one int or one per prompt.
      drafter: a drafter of any registered drafting method, as ``load_drafter`` returns it
        (``docs/methods.md``), for speculative decoding (None: autoregressive).
      **options: the fields of :class:`GenerateOptions`: ``temperature``, ``top_k``,
        ``top_p`` (0 = greedy), ``stop_token_ids``, ``seed``, ``block_size``, ``verify`` (the
        verify policy: "fixed", "adaptive", ``Adaptive(...)``, ``TreeVerify(nodes, topk)``),
        ``num_denoise_steps``, ``sampled_draft``, ``proposer``, ``attention_impl``, ``pad_to``.
    """
    opt = _with_cost_table(target, prompts, drafter, GenerateOptions.from_keywords("generate", options))
    with _compile_seconds(engine.prefill) as prefill_compile:
        pre = _prepare(target, prompts, max_new_tokens, drafter, opt)
    with _compile_seconds(engine.decode) as decode_compile:
        t1 = time.perf_counter()
        state = engine.decode(target.params, pre.drafter_params, pre.state, pre.max_new, pre.stop_ids,
                              np.int32(np.iinfo(np.int32).max), spec=pre.spec)
        out, n, accept_lens, verify_lens, iters = _fetch(
            (state.out, state.n, state.accept_lens, state.verify_lens, state.iters), target.mesh)
        decode_s = time.perf_counter() - t1
    result = _finish(out, n, accept_lens, verify_lens, iters, pre.stops, pre.prompt_lengths,
                     pre.spec.block_size, pre.prefill_time_s, decode_s)
    return dataclasses.replace(result, prefill_compile_s=prefill_compile[0], decode_compile_s=decode_compile[0])


def generate_stream(target: Target, prompts, max_new_tokens, *, drafter: Any = None,
                    iterations_per_chunk: int = 4, **options):
    """Like :func:`generate` (the same ``options``), but yields :class:`StreamChunk` s of newly
    committed tokens every ``iterations_per_chunk`` loop iterations (the same compiled loop,
    run in slices)."""
    if iterations_per_chunk < 1:
        raise ValueError(f"iterations_per_chunk must be >= 1, got {iterations_per_chunk}")
    opt = _with_cost_table(target, prompts, drafter,
                           GenerateOptions.from_keywords("generate_stream", options))
    pre = _prepare(target, prompts, max_new_tokens, drafter, opt)
    state = pre.state
    out, n, done = _fetch((state.out, state.n, state.done), target.mesh)
    seen = np.zeros_like(n)
    while True:
        yield StreamChunk([out[b, seen[b]:n[b]].tolist() for b in range(len(n))], done.tolist())
        if done.all():
            return
        seen = n
        state = engine.decode(target.params, pre.drafter_params, state, pre.max_new, pre.stop_ids,
                              np.int32(iterations_per_chunk), spec=pre.spec)
        out, n, done = _fetch((state.out, state.n, state.done), target.mesh)


def _finish(out, n, accept_lens, verify_lens, iters, stops, lens, block_size, prefill_s,
            decode_s) -> GenerateResult:
    seqs, reasons, acceptance_lengths = [], [], []
    for b in range(out.shape[0]):
        seq = [int(t) for t in out[b, :n[b]]]
        seqs.append(seq)
        reasons.append("stop" if seq and seq[-1] in set(stops[b][stops[b] >= 0].tolist()) else "length")
        acceptance_lengths.append([int(x) for x in accept_lens[b, :iters[b]]])
    return GenerateResult(seqs, reasons, list(lens), acceptance_lengths, block_size, prefill_s, decode_s,
                          int(iters.max()),
                          [[int(x) for x in verify_lens[b, :iters[b]]] for b in range(out.shape[0])])
