"""KVCache: static shapes, per-row writes, drop past the end, crop = set lengths."""

import jax.numpy as jnp
import numpy as np

from dflash_jax.nn.cache import KVCache


def test_write_per_row_positions_and_crop():
    c = KVCache.init(num_layers=2, batch=2, max_len=8, num_kv_heads=1, head_dim=2, dtype=jnp.bfloat16)
    assert c.k.shape == (2, 2, 8, 1, 2) and c.k.dtype == jnp.bfloat16
    k = jnp.arange(2 * 3 * 2, dtype=jnp.float32).reshape(2, 3, 1, 2) + 1
    pos = jnp.array([[0, 1, 2], [6, 7, 8]])  # row 1 runs past the end: slot 8 is dropped
    c2 = c.write(1, k, -k, pos)
    ref = np.zeros((2, 8, 1, 2), np.float32)
    ref[0, 0:3] = np.asarray(k[0])
    ref[1, 6:8] = np.asarray(k[1, :2])
    np.testing.assert_array_equal(np.asarray(c2.k[1], np.float32), ref)
    np.testing.assert_array_equal(np.asarray(c2.v[1], np.float32), -ref)
    np.testing.assert_array_equal(np.asarray(c2.k[0], np.float32), 0)
    c3 = c2.crop(jnp.array([2, 5]))
    assert c3.lengths.tolist() == [2, 5] and c3.lengths.dtype == jnp.int32
    assert c3.k is c2.k  # cropping moves no data
