"""Offline target features: computed once per data shard, reused by many drafters.

``features-00000.npy`` ... hold taps [n, L, k*D] of the matching data shard (float32, or
bfloat16 stored as uint16); ``features.json`` records the target, the tap ids, the dtype and the
tap convention (``TAP_CONVENTION``: the tap of layer i is transformers' ``hidden_states[i + 1]``,
the last layer's after the final norm). Caches without it predate that convention and are
refused: their last-layer features are the raw layer output.
"""

from __future__ import annotations

import glob
import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from dflash_jax.progress import progress

from dflash_jax.config import TargetConfig
from dflash_jax.files import atomic_path, check_settings, write_json
from dflash_jax.parallel.rules import DATA, mesh_axis_sizes
from dflash_jax.targets import target_forward
from dflash_jax.training import sharding

TAP_CONVENTION = "hf_hidden_states[i+1]"


def target_features(tcfg: TargetConfig, tparams, tokens, tap_layer_ids) -> jax.Array:
    """Teacher-forced taps [B, L, k*D] of the clean sequences (frozen target, no LM head)."""
    B, L = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))
    _, taps, _ = target_forward(tcfg, tparams, tokens, positions, tap_layer_ids=tap_layer_ids,
                                compute_logits=False)
    return jax.lax.stop_gradient(taps)


def write_features(target, data_dir: str, out_dir: str, tap_layer_ids, batch_size: int = 8,
                   store_dtype=None) -> dict:
    """Runs the frozen target over every sequence of ``data_dir`` and stores the taps, in
    ``store_dtype`` (default the target's dtype; ``"bfloat16"`` halves a float32 target's
    cache: the taps are rounded once, after the target computed them in its own dtype).

    A target on a mesh (``load_target(..., mesh=)``) runs sharded as in training
    (``training.sharding``): rows over ``data`` (a chunk is padded with rows of zeros to a
    multiple of it), the target tensor-parallel over ``model``; the taps come back whole and
    only process 0 writes files."""
    import jax

    main = jax.process_index() == 0
    os.makedirs(out_dir, exist_ok=True)
    taps = tuple(int(i) for i in tap_layer_ids)
    store = jnp.dtype(store_dtype or target.dtype)
    meta = {"target": target.path, "tap_layer_ids": list(taps), "data_dir": os.path.abspath(data_dir),
            "dtype": store.name, "tap_convention": TAP_CONVENTION}
    if store != jnp.dtype(target.dtype):
        meta["computed_in"] = jnp.dtype(target.dtype).name
    meta_file = os.path.join(out_dir, "features.json")
    check_settings(meta_file, meta, holder=f"{out_dir} holds features made", remedy="use a new directory")
    if main:
        write_json(meta_file, meta)
    if getattr(target, "mesh", None) is None:
        jitted = jax.jit(lambda p, t: target_features(target.config, p, t, taps))
        fn = lambda p, chunk: jitted(p, jnp.asarray(chunk))  # noqa: E731
    else:
        fn = _sharded_features(target, taps)
    shards = sorted(f for f in glob.glob(os.path.join(data_dir, "shard-*.npz")) if not f.endswith(".tmp.npz"))
    for shard in progress(shards, desc="target features", unit="shard"):
        out = os.path.join(out_dir, os.path.basename(shard).replace("shard-", "features-").replace(".npz", ".npy"))
        if os.path.exists(out):
            continue
        with np.load(shard) as z:
            tokens = z["tokens"]
        parts = []
        for lo in range(0, tokens.shape[0], batch_size):
            chunk = tokens[lo:lo + batch_size]
            parts.append(np.asarray(fn(target.params, chunk)).astype(store))
        arr = np.concatenate(parts)
        if arr.dtype == ml_dtypes.bfloat16:
            arr = arr.view(np.uint16)
        if main:
            with atomic_path(out, keep_extension=True) as tmp:
                np.save(tmp, arr)
    return meta


def _sharded_features(target, taps):
    """(params, numpy token chunk) -> its taps, run on the target's mesh (rows padded to a
    multiple of ``data``, the result whole on every process)."""
    import jax


    data = mesh_axis_sizes(target.mesh)[DATA]
    rows = sharding.batch_sharding(target.mesh)
    jitted = jax.jit(lambda p, t: target_features(target.config, p, t, taps),
                     in_shardings=(sharding.param_shardings(target.params, target.mesh), rows),
                     out_shardings=sharding.replicated(target.mesh))

    def fn(params, chunk):
        n = chunk.shape[0]
        padded = np.zeros((-(-n // data) * data,) + chunk.shape[1:], chunk.dtype)
        padded[:n] = chunk
        return jitted(params, sharding.global_array(padded, rows))[:n]
    return fn


class FeatureStore:
    """Memory-mapped offline features, indexed like :class:`TokenDataset` rows."""

    def __init__(self, features_dir: str, tap_layer_ids=None):
        with open(os.path.join(features_dir, "features.json")) as f:
            self.meta = json.load(f)
        if self.meta.get("tap_convention") != TAP_CONVENTION:
            raise ValueError(
                f"features in {features_dir} were written before the tap convention became "
                f"transformers' hidden_states[i + 1] (the last layer's tap after the final norm); "
                f"recompute them with `python -m dflash_jax features` (a cache whose taps exclude "
                f"the target's last layer is unaffected: add \"tap_convention\": \"{TAP_CONVENTION}\" "
                f"to its features.json)")
        if tap_layer_ids is not None and list(tap_layer_ids) != self.meta["tap_layer_ids"]:
            raise ValueError(f"features in {features_dir} tap layers {self.meta['tap_layer_ids']}, but the "
                             f"drafter needs {list(tap_layer_ids)}: compute features for these taps")
        files = sorted(f for f in glob.glob(os.path.join(features_dir, "features-*.npy"))
                       if not f.endswith(".tmp.npy"))
        if not files:
            raise FileNotFoundError(f"no features-*.npy in {features_dir!r}")
        self.parts = [np.load(f, mmap_mode="r") for f in files]
        self.offsets = np.cumsum([0] + [p.shape[0] for p in self.parts])
        self.bf16 = self.meta["dtype"] == "bfloat16"

        self.rows = int(self.offsets[-1])

    def __len__(self) -> int:
        return self.rows

    def hold_out(self, n: int) -> None:
        """Leaves the last ``n`` rows out, as :meth:`TokenDataset.hold_out` does to the
        sequences they belong to."""
        if not 0 <= n < self.rows:
            raise ValueError(f"cannot hold out {n} of {self.rows} feature rows")
        self.rows -= n

    def take(self, ids) -> np.ndarray:
        rows = []
        for i in ids:
            s = int(np.searchsorted(self.offsets, i, side="right") - 1)
            rows.append(np.asarray(self.parts[s][i - self.offsets[s]]))
        arr = np.stack(rows)
        return arr.view(ml_dtypes.bfloat16) if self.bf16 else arr
