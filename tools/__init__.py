"""Tools around the method, not the method: models of hardware and reports for GPUs (installed
as ``dflash_jax.tools``): the bytes/FLOPs roofline (``roofline``), the block-attention kernel's
GPU compile report (``gpu_compile``), the tensor-parallel communication model
(``parallel_comm``) and multi-device timings (``parallel_speed``), the training-memory model
(``train_memory``), kernel timings (``kernel_speed``) and the one-command GPU suite
(``gpu_suite``). Each is a command of ``python -m dflash_jax`` under its old name."""
