"""The DFlash paper's ablation numbers (SPEC.md section 6), to print beside ours.

Every row: the paper's setting, and per prompt set (speedup, tau) at T = 0. The paper's
ablations train Qwen3-8B drafters on 100K samples and measure on an H200 in bf16 at batch 1
with ``max_new_tokens`` 2048; its speedups are decode-only (SPEC section 6).
"""

from __future__ import annotations

SOURCE = "DFlash paper (arXiv 2602.06036), ablations: Qwen3-8B target, 100K training samples, H200, bf16, T=0"
SETS = ("math500", "humaneval", "mt-bench")


def _row(setting: dict, *pairs) -> dict:
    return {"setting": setting, "datasets": {s: {"speedup": sp, "tau": t} for s, (sp, t) in zip(SETS, pairs)}}


# draft layers (block size 16, 5 taps)
DEPTH = [
    _row({"layers": 3}, (4.69, 5.64), (3.90, 4.61), (2.38, 3.18)),
    _row({"layers": 5}, (4.71, 5.99), (3.96, 4.94), (2.35, 3.37)),
    _row({"layers": 8}, (4.64, 6.33), (3.96, 5.29), (2.23, 3.50)),
]

# train block size -> test block size (8-layer drafters; 16 -> 16 is the 8-layer row above)
BLOCK_SIZE = [
    _row({"train_block_size": 16, "eval_block_size": 16}, (4.64, 6.33), (3.96, 5.29), (2.23, 3.50)),
    _row({"train_block_size": 16, "eval_block_size": 8}, (3.87, 5.09), (3.39, 4.44), (2.12, 3.18)),
    _row({"train_block_size": 8, "eval_block_size": 16}, (3.78, 5.02), (3.24, 4.28), (2.09, 3.09)),
    _row({"train_block_size": 8, "eval_block_size": 8}, (3.97, 5.21), (3.53, 4.61), (2.22, 3.29)),
]


def markdown(rows: list[dict], keys: list[str]) -> str:
    """The paper's rows as a markdown table (speedup / tau per set)."""
    head = "| " + " | ".join(keys) + " | " + " | ".join(f"{s} speedup / tau" for s in SETS) + " |"
    lines = [head, "|" + "---|" * (len(keys) + len(SETS))]
    for r in rows:
        cells = [str(r["setting"][k]) for k in keys]
        cells += [f"{r['datasets'][s]['speedup']:.2f}x / {r['datasets'][s]['tau']:.2f}" for s in SETS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\n({SOURCE})"
