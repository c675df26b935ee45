"""Tools around the method, not the method: models of hardware and reports for GPUs (installed
as ``dflash_jax.tools``): the bytes/FLOPs roofline (``roofline``; ``roofline_moe`` and ``roofline_hybrid`` for MoE and
hybrid Gated DeltaNet targets, ``roofline_tree`` for tree verification's node budget), the GDN rollback's two record modes (``gdn_rollback``) and a
hybrid target against a dense one (``hybrid_speed``), the block-attention kernel's
GPU compile report (``gpu_compile``), the tensor-parallel communication model
(``parallel_comm``) and multi-device timings (``parallel_speed``), the training-memory model
(``train_memory``), kernel timings (``kernel_speed``), the tree mask's verify cost
(``tree_verify_cost``), the chain against trees in the bench protocol (``tree_bench``) and
the one-command GPU suite
(``gpu_suite``). Each is a command of ``python -m dflash_jax`` under its old name."""
