"""RMSNorm, rotary position embeddings (default, llama3 and yarn scaling) and the SwiGLU MLP."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.config import RopeConfig


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x^2) + eps)``, normalised in fp32, over the last axis."""

    eps: float = 1e-6
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        weight = self.param("weight", nn.initializers.ones, (x.shape[-1],), self.param_dtype)
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return weight * xf.astype(x.dtype)


def rope_inv_freq(head_dim: int, rope: RopeConfig) -> np.ndarray:
    """Inverse frequencies float32[head_dim // 2], with llama3 scaling when configured."""
    inv_freq = 1.0 / (rope.theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if rope.rope_type == "llama3":
        old_len = rope.original_max_position_embeddings
        low_wavelen = old_len / rope.low_freq_factor
        high_wavelen = old_len / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old_len / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = np.where(medium, smoothed, scaled)
    elif rope.rope_type == "yarn":
        inv_freq = _yarn_inv_freq(head_dim, rope)
    return inv_freq.astype(np.float32)


def _yarn_inv_freq(head_dim: int, rope: RopeConfig) -> np.ndarray:
    """YaRN's blend of the plain frequencies (fast dimensions, extrapolated) and the ones
    divided by ``factor`` (slow dimensions, interpolated), with a linear ramp between the
    dimensions where a wave turns ``beta_fast`` and ``beta_slow`` times over the original
    context (floored / ceiled to whole dimensions when ``truncate``), as transformers'
    ``_compute_yarn_parameters`` computes it (in float32, like it)."""
    base, dim = rope.theta, head_dim

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(rope.original_max_position_embeddings / (rotations * 2 * math.pi))
                ) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    pos_freqs = (np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
                 ).astype(np.float32)
    extrapolation = np.float32(1.0) / pos_freqs
    interpolation = np.float32(1.0) / (np.float32(rope.factor) * pos_freqs)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low))
                   / np.float32(high - low), 0, 1).astype(np.float32)
    keep = np.float32(1.0) - ramp  # 1: extrapolate (plain frequency), 0: interpolate
    return (interpolation * (np.float32(1.0) - keep) + extrapolation * keep).astype(np.float32)


def rope_cos_sin(positions: jax.Array, head_dim: int, rope: RopeConfig):
    """cos, sin: float32[..., head_dim] for integer ``positions[...]`` (halves repeated), times
    ``rope.attention_scaling`` (YaRN's cos/sin scale, transformers' ``attention_scaling``; 1
    for the other rope types, which then compute exactly as before)."""
    inv_freq = jnp.asarray(rope_inv_freq(head_dim, rope))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)
    scale = rope.attention_scaling
    if scale == 1.0:
        return jnp.cos(angles), jnp.sin(angles)
    return jnp.cos(angles) * scale, jnp.sin(angles) * scale


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates ``x[B, T, heads, Dh]`` by ``cos/sin[B, T, Dh]`` (rotate-half convention)."""
    xf = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    out = xf * cos[:, :, None, :] + rotated * sin[:, :, None, :]
    return out.astype(x.dtype)


class RowParallelDense(nn.Module):
    """A Dense layer whose input dimension is split over the mesh axis ``axis_name`` (the
    Megatron row-parallel layer: attention's o_proj, the MLP's down_proj): the local products
    are summed with one ``psum`` and the (replicated) bias is added once, after it. Parameters
    ``kernel`` [in/m, out] and ``bias`` [out], named as ``nn.Dense``'s."""

    features: int
    use_bias: bool = False
    param_dtype: jnp.dtype = jnp.float32
    axis_name: str = "model"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.param("kernel", nn.initializers.lecun_normal(),
                            (x.shape[-1], self.features), self.param_dtype)
        y = jax.lax.psum(jnp.dot(x, kernel.astype(x.dtype)), self.axis_name)
        if self.use_bias:
            y = y + self.param("bias", nn.initializers.zeros, (self.features,),
                               self.param_dtype).astype(y.dtype)
        return y


def out_projection(features: int, use_bias: bool, param_dtype, axis_name: str | None,
                   name: str | None = None) -> nn.Module:
    """``nn.Dense`` on one device (``axis_name`` None), :class:`RowParallelDense` under tensor
    parallelism; the same parameter names either way."""
    if axis_name is None:
        return nn.Dense(features, use_bias=use_bias, param_dtype=param_dtype, name=name)
    return RowParallelDense(features, use_bias, param_dtype, axis_name, name=name)


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``, no biases. ``axis_name``: the mesh axis the
    intermediate dimension is split over (tensor parallelism; a psum after down_proj)."""

    intermediate_size: int
    param_dtype: jnp.dtype = jnp.float32
    axis_name: str | None = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        dense = lambda n, name: nn.Dense(n, use_bias=False, param_dtype=self.param_dtype, name=name)
        h = nn.silu(dense(self.intermediate_size, "gate_proj")(x)) * dense(
            self.intermediate_size, "up_proj")(x)
        return out_projection(x.shape[-1], False, self.param_dtype, self.axis_name, "down_proj")(h)


def random_init(params, key: jax.Array, init_scale: float, dtype):
    """Replaces initialised Flax params (arrays, or their ``jax.ShapeDtypeStruct``s) with the
    project's random init: RMSNorm ``weight`` = 1, ``bias`` = 0, every other leaf
    normal(0, init_scale) in ``dtype``."""
    leaves, tree = jax.tree_util.tree_flatten_with_path(params)
    keys = jax.random.split(key, len(leaves))
    out = []
    for (path, leaf), k in zip(leaves, keys):
        name = jax.tree_util.keystr(path)
        if "weight" in name:
            out.append(jnp.ones(leaf.shape, leaf.dtype))
        elif "bias" in name:
            out.append(jnp.zeros(leaf.shape, leaf.dtype))
        else:
            out.append((init_scale * jax.random.normal(k, leaf.shape, jnp.float32)).astype(dtype))
    return jax.tree_util.tree_unflatten(tree, out)


def random_params_of_shapes(shapes, key: jax.Array, init_scale: float, dtype):
    """:func:`random_init` of a tree of shapes (tuples at the leaves), under ``jit``: the
    parameters of a family that builds its tree from shapes rather than a Flax module."""
    structs = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s, dtype), shapes,
                                     is_leaf=lambda s: isinstance(s, tuple))
    return jax.jit(lambda k: random_init(structs, k, init_scale, dtype))(key)


def random_module_params(init_fn, key: jax.Array, init_scale: float, dtype):
    """:func:`random_init` of the parameters ``init_fn(key)`` (a Flax ``model.init(...)["params"]``)
    would make, under ``jit``. Only their shapes are taken from ``init_fn`` (``jax.eval_shape``),
    so the compiled program holds the random draws alone, not the forward pass the init traces
    (the values are those of jitting ``init_fn`` and redrawing every leaf: the same keys and
    draws). Most of such a program's compile time is the draws' threefry code: about 4 s for a
    tiny target at XLA:CPU's default settings, 1 s at the test suite's (tests/support/fast_compile.py)."""
    shapes = jax.eval_shape(init_fn, key)
    return jax.jit(lambda k: random_init(shapes, k, init_scale, dtype))(key)
