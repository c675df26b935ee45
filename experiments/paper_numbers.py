"""The DFlash paper's numbers (docs/method.md section 6), to print and plot beside ours.

Every row: the paper's setting, and per prompt set ``{"speedup": x | None, "tau": t}`` at
T = 0 unless the row says otherwise (``None``: the paper gives no number there). The paper's
ablations train Qwen3-8B drafters on 100K samples and measure on an H200 in bf16 at batch 1
with ``max_new_tokens`` 2048; its speedups are decode-only (docs/method.md section 6). The input-fusion
comparison is on Qwen3-4B and reports tau only.
"""

from __future__ import annotations

SOURCE = "DFlash paper (arXiv 2602.06036): Qwen3-8B target, 100K training samples, H200, bf16, T=0"
SETS = ("math500", "humaneval", "mt-bench")


def _row(setting: dict, *pairs, sets=SETS, note: str | None = None) -> dict:
    row = {"setting": setting, "datasets": {s: {"speedup": sp, "tau": t} for s, (sp, t) in zip(sets, pairs)}}
    return row | ({"note": note} if note else {})


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

# number of target taps (3-layer drafters; the 5-tap row is DEPTH's 3-layer row)
TAPS = [
    _row({"num_taps": 3}, (4.49, 5.38), (3.80, 4.47), (2.32, 3.07)),
    _row({"num_taps": 5}, (4.69, 5.64), (3.90, 4.61), (2.38, 3.18)),
]

# how the target's features reach the drafter: KV injection vs input fusion (Qwen3-4B, tau
# only, GSM8K / HumanEval / MT-Bench), and no target features at all (Qwen3-8B, GSM8K / MATH-500)
CONDITIONING = [
    _row({"conditioning": "kv"}, (None, 4.2), (None, 4.0), (None, 3.0), sets=("gsm8k", "humaneval", "mt-bench"),
         note="Qwen3-4B, tau only"),
    _row({"conditioning": "input"}, (None, 3.5), (None, 3.5), (None, 2.6), sets=("gsm8k", "humaneval", "mt-bench"),
         note="Qwen3-4B, tau only"),
    _row({"conditioning": "none"}, (2.83, 3.38), (3.73, 4.61), sets=("gsm8k", "math500")),
]

# random anchors vs fixed block boundaries (MATH-500; the random row is DEPTH's 3-layer row)
ANCHORS = [
    _row({"anchors": "random"}, (4.69, 5.64), sets=("math500",)),
    _row({"anchors": "fixed"}, (4.13, 4.94), sets=("math500",)),
]

# the paper reports no numbers for the loss decay (the paper motivates it: acceptance stops at the
# first wrong draft, so the early positions matter most) nor for denoising steps (future work)
LOSS_DECAY: list[dict] = []
DENOISE: list[dict] = []

# Table 1, Qwen3-8B, speedup / tau
TABLE1 = {
    0.0: {"gsm8k": (5.15, 6.54), "math500": (6.08, 7.87), "humaneval": (5.14, 6.50), "mbpp": (4.65, 5.95),
          "mt-bench": (2.75, 4.24), "average": (4.86, 6.49)},
    1.0: {"average": (4.03, 5.48)},
}
EAGLE3_TABLE1_AVERAGE = (1.76, 2.96)  # EAGLE-3 (tree 16), T = 0, average speedup / tau
TABLE1_QWEN3_4B_AVERAGE = (4.91, 6.54)

# the temperature ablation: Table 1's averages at T = 0 and T = 1 (greedy drafts)
TEMPERATURE = [
    _row({"temperature": 0.0, "draft": "greedy"}, TABLE1[0.0]["average"], sets=("average",)),
    _row({"temperature": 1.0, "draft": "greedy"}, TABLE1[1.0]["average"], sets=("average",)),
]


def markdown(rows: list[dict], keys: list[str]) -> str:
    """The paper's rows as a markdown table (speedup / tau per set; - where it gives none)."""
    if not rows:
        return "(docs/method.md records no numbers from the paper for this ablation)"
    sets = list(dict.fromkeys(s for r in rows for s in r["datasets"]))
    notes = any(r.get("note") for r in rows)
    head = ("| " + " | ".join(keys) + " | " + " | ".join(f"{s} speedup / tau" for s in sets) + " |"
            + (" note |" if notes else ""))
    lines = [head, "|" + "---|" * (len(keys) + len(sets) + notes)]
    for r in rows:
        cells = [str(r["setting"][k]) for k in keys]
        for s in sets:
            d = r["datasets"].get(s)
            cells.append("-" if d is None else
                         ("-" if d["speedup"] is None else f"{d['speedup']:.2f}x") + f" / {d['tau']:.2f}")
        lines.append("| " + " | ".join(cells) + " |" + (f" {r.get('note', '')} |" if notes else ""))
    return "\n".join(lines) + f"\n\n({SOURCE}; rows with a note differ as it says)"


# the DFlash family head to head (experiments.compare_methods): each method's authors' own numbers
# on Qwen3-8B, each against their own DFlash baseline, engine and data (tau, speedup where given)
METHODS = [
    _row({"method": "dflash", "temperature": 0.0}, *[TABLE1[0.0][s] for s in ("gsm8k", "math500", "humaneval",
                                                                            "mbpp", "mt-bench")],
         sets=("gsm8k", "math500", "humaneval", "mbpp", "mt-bench"), note="DFlash paper, Table 1"),
    _row({"method": "dflash", "temperature": 1.0}, TABLE1[1.0]["average"], sets=("average",),
         note="DFlash paper, Table 1"),
    _row({"method": "dflash", "temperature": 1.0}, (None, 5.33), sets=("gsm8k",),
         note="DSpark paper's DFlash baseline (offline)"),
    _row({"method": "dspark", "temperature": 1.0}, (None, 6.17), sets=("gsm8k",),
         note="DSpark paper (arXiv 2607.05147, offline)"),
    _row({"method": "eagle3", "temperature": 0.0}, EAGLE3_TABLE1_AVERAGE, sets=("average",),
         note="DFlash paper, Table 1 (tree 16)"),
]
