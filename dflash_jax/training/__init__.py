"""Drafter training (docs/method.md section 5): target-regenerated data, random-anchor blocks with the
sparse visibility rule, the decayed loss, online/offline target features, and the optax +
Orbax loop with exact resume."""
