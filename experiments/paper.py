"""The paper's tables and figures, each one command, for the target and drafter at hand
(the embedded pair by default; ``--target`` / ``--drafter`` for a real one).

    python -m experiments.paper table1              # speedup and tau per prompt set, T = 0 and T = 1,
                                                    # beside EAGLE-3's chain and trees 16 / 60 (T = 0)
    python -m experiments.paper acceptance          # acceptance histogram and per-position rate per set
    python -m experiments.paper block_size_curve    # tau and speedup against the inference block size
    python -m experiments.paper training_curve      # held-out tau against training steps (--run DIR)
    python -m experiments.paper all                 # all of them, every ablation, then README.md
    python -m experiments.paper readme              # README.md alone from what earlier runs saved
    python -m experiments.paper all --preset smoke  # seconds: every stage runs
    python -m experiments.paper all --preset test   # the same at the test suite's size
    experiments.paper.run("table1", preset="smoke") -> dict

table1's EAGLE-3 columns (``--eagle3``: ``embedded-eagle3`` by default with the cpu preset
when it is installed (``none`` without it), a directory, ``random`` for a random-weight drafter, ``none`` for no columns) are ``bench
--drafter EAGLE3`` on the same prompts at T = 0: the chain of ``block_size - 1`` = 7 steps and the
trees ``--eagle3-trees`` (default 16 nodes with top-4 and 60 with EAGLE-3's default top-10, the
paper's two budgets), beside the paper's EAGLE-3 numbers (Qwen3-8B, T = 0: tree 16 1.76x / tau
2.96, tree 60 2.02x). ``--repeats R`` measures every cell R times (the cpu preset: 3): tau is the
first run's (at T = 0 the runs decode the same tokens), the speedup is computed from each
response's decode times averaged over the runs (its interval from those), and each run's own
speedup and load average are recorded and shown.

Every measurement is the benchmark's protocol (``python -m dflash_jax bench``: AR and DFlash
on the same prompts, batch 1, interleaved per prompt; docs/method.md section 6's metrics with 95 %
intervals) and is kept per (pair, prompt set, temperature, block size) under ``--work``
(``WORK/paper/<hash>/record.json``), so an interrupted run resumes where it stopped and the
items share measurements (``acceptance`` reads ``table1``'s T = 0 runs, ``block_size_curve``
reuses the drafter's own block size). The outputs, under ``--out`` (default
``$DFLASH_JAX_HOME/results/paper`` for the cpu preset, ``.../paper-<preset>`` otherwise;
``DFLASH_JAX_HOME`` defaults to ``~/.cache/dflash-jax``, outside the checkout):
``<item>.json``, ``<item>.md`` where there is a table, ``<item>.png``, and for ``all``
``README.md``, one page with each table and figure, the command, the budget, and a sentence per
item on agreement with the paper's direction (a finding only where the 95 % intervals allow
it: ``dflash_jax.metrics.interval_supported``). The ablations of ``all`` write to their own
directories (``$DFLASH_JAX_HOME/results/ablations/<name>`` for the cpu preset;
``--ablations-out DIR`` puts them under DIR). The committed results are rewritten only on
request: ``python -m experiments.paper all --out results/paper --ablations-out results/ablations``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import time
import types
from typing import Sequence

import numpy as np

from dflash_jax import metrics
from dflash_jax.bench.prompt_sets import DATASETS, SUBSETS, load_prompt_set
from dflash_jax.files import write_json, write_text
from dflash_jax.models.handles import (EMBEDDED_DRAFTER_DIR, load_drafter,
                                       load_target)
from dflash_jax.experiments import framework, paper_numbers as numbers
from dflash_jax.bench.harness import average
from dflash_jax.progress import progress
from dflash_jax import figures
from dflash_jax.reporting import (command_line, cpu_model, environment, load_average, new_figure, portable_path,
                                  save_figure)
from dflash_jax.cli import run_cli
from dflash_jax.decoding import engine
from dflash_jax.bench import harness
from dflash_jax.decoding.tree_args import tree_spec as parse_tree_spec
from dflash_jax.methods.eagle3.named import EMBEDDED_EAGLE3, NAMES_HELP, RANDOM, load_eagle3_drafter
from dflash_jax.bench.harness import drafter_block_size
from dflash_jax.methods.eagle3.handle import EMBEDDED_EAGLE3_DIR

ITEMS = ("table1", "acceptance", "block_size_curve", "training_curve")
ABLATIONS = ("ablate_depth", "ablate_block_size", "ablate_taps", "ablate_conditioning", "ablate_anchors",
             "ablate_loss_decay", "ablate_denoise", "ablate_temperature")
INDEX = "paper.json"


@dataclasses.dataclass(frozen=True)
class Options:
    """What the tables and figures depend on; each field is an option (``--max-samples``...),
    each preset gives every default.

    Attributes:
        target: Hugging Face target directory (with its tokenizer); 'embedded' (default): the
            target shipped in the package
        drafter: DFlash drafter directory (default: the embedded drafter, for the embedded target;
            'embedded' names it too)
        others: more drafter directories, one column each in table1
        eagle3: table1's EAGLE-3 drafter: 'embedded-eagle3' (shipped with the package), a
            directory, 'random' (random weights, smoke only), or 'none' (no EAGLE-3 columns)
        eagle3_trees: table1's EAGLE-3 trees, N:TOPK each (beside its chain)
        repeats: runs of every measurement (the speed is averaged over them)
        dtype: dtype the pair computes in (float32 on CPU, bfloat16 on a GPU when not given)
        datasets: prompt sets
        max_samples: prompts per set
        max_new_tokens: tokens generated per prompt
        temperatures: table1's temperatures (the paper's: 0 and 1)
        block_sizes: block_size_curve's inference block sizes
        subset: which prompts of a set (as ``bench --subset``)
        seed: seed of the prompt subsets and of sampling
        runs: training_curve's drafter run directories (metrics.jsonl with eval_tau); default
            the embedded drafter's shipped training metrics
    """

    target: str = framework.EMBEDDED
    drafter: str | None = None
    others: tuple[str, ...] = ()
    eagle3: str = "none"
    eagle3_trees: tuple[str, ...] = ("16:4", "60:10")
    repeats: int = 1
    dtype: str | None = None
    datasets: tuple[str, ...] = DATASETS
    max_samples: int = 6
    max_new_tokens: int = 96
    temperatures: tuple[float, ...] = (0.0, 1.0)
    block_sizes: tuple[int, ...] = (4, 8, 16)
    subset: str = "random"
    seed: int = 0
    runs: tuple[str, ...] = ()


# table1's EAGLE-3 columns by default when the embedded EAGLE-3 drafter is installed (without
# it the cpu preset makes table1 without them, as before; --eagle3 DIR names another one)
_CPU_EAGLE3 = ("embedded-eagle3" if os.path.exists(os.path.join(EMBEDDED_EAGLE3_DIR, "config.json"))
               else "none")

PRESETS = {
    "smoke": dict(datasets=("gsm8k", "humaneval"), max_samples=1, max_new_tokens=16, block_sizes=(4, 16)),
    # the test suite's: smoke's sizes on an MBPP and a MATH-500 prompt (seed 1: 48 and 47 tokens)
    # of one (prompt width, cache) shape, the experiments' test preset's (48, 128): both sets and
    # the ablations' cells run the same programs (the embedded drafter has the 1-layer cells' config)
    "test": dict(datasets=("mbpp", "math500"), max_samples=1, max_new_tokens=16, block_sizes=(4, 16), seed=1),
    "cpu": dict(block_sizes=(4, 8, 16), eagle3=_CPU_EAGLE3, repeats=3),
    "gpu": dict(target=None, max_samples=128, max_new_tokens=2048, block_sizes=(4, 8, 12, 16)),
}


def options(preset: str, **overrides) -> Options:
    """The options of ``preset`` with ``overrides`` (field names); unknown names are errors."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    names = {f.name for f in dataclasses.fields(Options)}
    unknown = [k for k in overrides if k not in names]
    if unknown:
        raise ValueError(f"experiments.paper has no option {unknown[0]!r}; the options are: {', '.join(sorted(names))}")
    values = PRESETS[preset] | {k: v for k, v in overrides.items() if v is not None}
    for k in ("others", "datasets", "temperatures", "block_sizes", "runs", "eagle3_trees"):
        if k in values and not isinstance(values[k], (str, bytes)):
            values[k] = tuple(values[k])
    return Options(**values)


def check(opt: Options) -> None:
    """Refuses bad options before anything loads or runs."""
    if opt.target is None:
        raise ValueError("this preset needs --target (a Hugging Face target directory) and --drafter")
    bad = [d for d in opt.datasets if d not in DATASETS]
    if bad or not opt.datasets:
        raise ValueError(f"unknown prompt set {bad[0] if bad else '(none given)'}; choose from {', '.join(DATASETS)}")
    if opt.subset not in SUBSETS:
        raise ValueError(f"unknown subset {opt.subset!r}; choose from {', '.join(SUBSETS)}")
    if opt.max_samples < 1 or opt.max_new_tokens < 1:
        raise ValueError("--max-samples and --max-new-tokens must be >= 1")
    if not opt.temperatures or any(t < 0 for t in opt.temperatures):
        raise ValueError(f"temperatures must be >= 0, got {list(opt.temperatures)}")
    if not opt.block_sizes or any(b < 2 for b in opt.block_sizes):
        raise ValueError(f"block sizes must be >= 2 (1 is the AR baseline itself), got {list(opt.block_sizes)}")
    for what, d in (("target", opt.target), ("drafter", opt.drafter), *(("drafter", o) for o in opt.others),
                    *(("run", r) for r in opt.runs)):
        if d is not None and not os.path.isdir(framework.checkpoint_dir(d, what)):
            raise FileNotFoundError(f"{what} directory {d!r} does not exist")
    if opt.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {opt.repeats}")
    for t in opt.eagle3_trees:
        eagle3_tree(t)
    if opt.eagle3 not in (NO_EAGLE3, RANDOM, EMBEDDED_EAGLE3) and not os.path.isdir(opt.eagle3):
        raise FileNotFoundError(f"--eagle3 {opt.eagle3!r}: not a directory; give {NAMES_HELP}, or 'none'")
    if opt.drafter is None and not _embedded_target(opt):
        raise ValueError("--drafter is required with a --target other than the embedded one")
    for r in opt.runs:
        if not os.path.exists(os.path.join(r, "metrics.jsonl")):
            raise FileNotFoundError(f"run directory {r!r} has no metrics.jsonl (a drafter training run)")


def check_eagle3(opt: Options) -> None:
    """table1's EAGLE-3 drafter is there (checked only when table1 is made: the other items do
    not use it)."""
    if opt.eagle3 == EMBEDDED_EAGLE3 and not os.path.exists(os.path.join(EMBEDDED_EAGLE3_DIR, "config.json")):
        raise FileNotFoundError(f"--eagle3 {EMBEDDED_EAGLE3} (the cpu preset's): the shipped EAGLE-3 drafter is not "
                                f"in this installation ({EMBEDDED_EAGLE3_DIR}); give --eagle3 DIR, or --eagle3 none "
                                "for table1 without the EAGLE-3 columns")


NO_EAGLE3 = "none"


def eagle3_tree(value) -> tuple[int, int]:
    """One ``--eagle3-trees`` value ``N:TOPK``."""
    return parse_tree_spec(value, "--eagle3-trees")


def _embedded_target(opt: Options) -> bool:
    return framework.recorded_path(opt.target, "target") == framework.EMBEDDED


def default_out(preset: str) -> str:
    """``HOME/results/paper`` for the cpu preset, ``HOME/results/paper-<preset>`` otherwise
    (:func:`experiments.framework.home`: outside the checkout)."""
    return os.path.join(framework.home(), "results", "paper" if preset == "cpu" else f"paper-{preset}")


def recorded_options(opt: Options) -> dict:
    """The options as the outputs record them: the shipped pair as ``embedded`` (the drafter
    as None, its default), other directories by :func:`experiments.framework.recorded_path`."""
    d = json.loads(json.dumps(dataclasses.asdict(opt)))
    d["target"] = framework.recorded_path(opt.target, "target")
    drafter = framework.recorded_path(opt.drafter, "drafter")
    d["drafter"] = None if drafter == framework.EMBEDDED else drafter
    d["others"] = [framework.recorded_path(o, "drafter") for o in opt.others]
    d["runs"] = [framework.recorded_path(r) for r in opt.runs]
    if opt.eagle3 not in (NO_EAGLE3, RANDOM, EMBEDDED_EAGLE3):
        d["eagle3"] = framework.recorded_path(opt.eagle3)
    return d


# ---------------------------------------------------------------------------- measurements
class Session:
    """The loaded pair(s) and the measurement cache of one invocation; ``log`` says what is
    reused from ``work`` (:class:`experiments.framework.WorkLog`; default: one of its own)."""

    def __init__(self, opt: Options, work: str, log: framework.WorkLog | None = None):
        import jax
        import jax.numpy as jnp


        self.opt, self.work = opt, os.path.abspath(work)
        self.log = log if log is not None else framework.WorkLog(self.work)
        dtype = jnp.dtype(opt.dtype) if opt.dtype else (jnp.float32 if jax.devices()[0].platform == "cpu"
                                                        else jnp.bfloat16)
        self.target = load_target(framework.checkpoint_dir(opt.target), dtype=dtype)
        if self.target.tokenizer is None:
            raise ValueError(f"{opt.target} has no tokenizer; the prompt sets are text")
        self.drafter_dirs = [framework.checkpoint_dir(d, "drafter")
                             for d in (opt.drafter or framework.EMBEDDED, *opt.others)]
        # loading checks every drafter against the target (a mismatched pair fails here, before any run)
        self.drafters = {d: load_drafter(d, self.target, dtype=dtype) for d in self.drafter_dirs}
        self.main = self.drafter_dirs[0]
        self.ids = {"target": framework.target_identity(framework.checkpoint_dir(opt.target)),
                    "dtype": str(np.dtype(dtype))} | {
            d: framework.target_identity(d) for d in self.drafter_dirs}
        self._dtype = dtype

    @property
    def eagle3(self):
        """table1's EAGLE-3 drafter (loaded on first use), or None (``--eagle3 none``)."""
        if self.opt.eagle3 == NO_EAGLE3:
            return None
        if EAGLE3_KEY not in self.drafters:
            d = load_eagle3_drafter(self.opt.eagle3, self.target, dtype=self._dtype)
            self.drafters[EAGLE3_KEY] = d
            self.ids[EAGLE3_KEY] = {"random": 0} if self.opt.eagle3 == RANDOM else framework.target_identity(d.path)
        return self.drafters[EAGLE3_KEY]

    def measure(self, drafter_dir: str, dataset: str, temperature: float, block_size: int | None, bar,
                tree: tuple[int, int] | None = None) -> dict:
        """One prompt set under the bench protocol, ``--repeats`` times (cached; see the module
        docstring); ``drafter_dir``: a DFlash drafter's directory or :data:`EAGLE3_KEY`;
        ``tree``: (N, topk) verifies trees."""
        runs = [self._measure_run(drafter_dir, dataset, temperature, block_size, bar, tree, i)
                for i in range(self.opt.repeats)]
        return runs[0] if len(runs) == 1 else combine_runs(runs)

    def _measure_run(self, drafter_dir, dataset, temperature, block_size, bar, tree, run) -> dict:
        o = self.opt
        drafter = self.drafters[drafter_dir]
        bs = block_size or drafter_block_size(drafter)
        key = {"target": self.ids["target"], "dtype": self.ids["dtype"], "drafter": self.ids[drafter_dir],
               "dataset": dataset, "max_samples": o.max_samples, "max_new_tokens": o.max_new_tokens,
               "temperature": float(temperature), "block_size": bs, "subset": o.subset, "seed": o.seed,
               "loop_version": engine.LOOP_VERSION}  # a loop that costs otherwise: measured again
        if tree:  # (keys of chains and first runs as before: their records stay valid)
            key["tree"] = list(tree)
        if run:
            key["run"] = run
        path = os.path.join(self.work, "paper", framework.stable_hash(key), "record.json")
        made = {}

        def make(dest):
            made["record"] = self._measure(drafter, dataset, temperature, bs, key, dest, bar, tree)

        name = EAGLE3_KEY if drafter_dir == EAGLE3_KEY else framework.recorded_path(drafter_dir, "drafter")
        shown = {"drafter": name, "dataset": dataset, "temperature": float(temperature), "block_size": bs,
                 "tree": ":".join(map(str, tree)) if tree else None, "run": run or None}
        about = framework.brief(shown, list(shown))
        # a second process measuring the same waits for it and reuses it (framework.work_entry)
        framework.work_entry(self.log, "measurement", path, make, about=about, settings=path)
        if "record" in made:
            return made["record"]
        with open(path) as f:
            return json.load(f)["record"]

    def _measure(self, drafter, dataset, temperature, bs, key, path, bar, tree=None) -> dict:

        o = self.opt
        args = types.SimpleNamespace(max_new_tokens=o.max_new_tokens, temperature=float(temperature), seed=o.seed,
                                     block_size=bs, thinking=False, num_denoise_steps=1,
                                     tree=tree[0] if tree else None, tree_topk=tree[1] if tree else None)
        samples = load_prompt_set(dataset, None, o.max_samples, o.seed, subset=o.subset)
        load = load_average()
        # the set at its own program shape: its decode timings are its own (bench --program-shape)
        record = harness.bench_dataset(harness.Runner(self.target, drafter, args), samples, bar)
        record["load_average_before"] = load
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_json(path, {"key": key, "record": record, "environment": environment(),
                          "finished": time.strftime("%Y-%m-%d %H:%M:%S")})
        return record

    def grid(self, jobs: list[tuple], desc: str) -> list[dict]:
        """:meth:`measure` of each job (drafter, set, temperature, block size[, tree])."""
        n = self.opt.repeats * sum(len(s.turns) for _, d, *_ in jobs
                                   for s in load_prompt_set(d, None, self.opt.max_samples, self.opt.seed,
                                                            subset=self.opt.subset))
        with progress(total=n, desc=desc, unit="prompt") as bar:
            return [self.measure(*job[:4], bar, *job[4:]) for job in jobs]


EAGLE3_KEY = "eagle3"  # Session.drafters' key of the EAGLE-3 drafter


def combine_runs(runs: list[dict]) -> dict:
    """One prompt set's record from ``repeats`` runs of it (the module docstring): the first
    run's responses with each response's AR and speculative decode (and end-to-end) times
    averaged over the runs, summarised again (``harness.summarize_set``); ``runs`` keeps each
    run's own decode speedup and load average."""
    first = json.loads(json.dumps(runs[0]))
    for i, sample in enumerate(first["samples"]):
        for method in ("ar", "dflash"):
            for field in ("decode_s", "total_s", "prefill_s"):
                if field in sample[method]:
                    sample[method][field] = float(np.mean([r["samples"][i][method][field] for r in runs]))
    bs = len(first["histogram"])
    rec = harness.summarize_set({k: v for k, v in first.items()}, bs)
    rec["runs"] = [{"speedup": r["speedup"], "load_average_before": r.get("load_average_before")} for r in runs]
    return rec


def _average(records: dict[str, dict]) -> dict:
    """The average over prompt sets, with the responses its intervals rest on."""
    return average(records) | {"responses": int(sum(r["turns"] for r in records.values()))}


def _ci(r: dict, key: str) -> str:
    return metrics.interval_text(r[key], r[key + "_ci"])


# ---------------------------------------------------------------------------- the items
def table1(s: Session) -> dict:
    """Speedup and tau per prompt set and on average, at each temperature, for every drafter;
    the paper's Table 1 beside them."""
    o = s.opt
    res = {}
    for d in s.drafter_dirs:
        for t in o.temperatures:
            recs = s.grid([(d, n, t, None) for n in o.datasets], f"table1 {_name(d, s)} T={t:g}")
            per = dict(zip(o.datasets, recs))
            res.setdefault(d, {})[f"{t:g}"] = {"datasets": {n: _strip(r) for n, r in per.items()},
                                              "average": _average(per)}
    names = {d: _name(d, s) for d in s.drafter_dirs}
    head = "| prompt set | " + " | ".join(f"{names[d]} T={t:g}: speedup / tau" for d in s.drafter_dirs
                                         for t in o.temperatures) + " | the paper T=0 | the paper T=1 |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for n in list(o.datasets) + ["average"]:
        cells = []
        for d in s.drafter_dirs:
            for t in o.temperatures:
                r = res[d][f"{t:g}"]["average"] if n == "average" else res[d][f"{t:g}"]["datasets"][n]
                cells.append(f"{_ci(r, 'speedup')}x / {_ci(r, 'tau')}")
        paper = [numbers.TABLE1[t].get(n) for t in (0.0, 1.0)]
        cells += ["-" if p is None else f"{p[0]:.2f}x / {p[1]:.2f}" for p in paper]
        lines.append(f"| {'**average**' if n == 'average' else n} | " + " | ".join(cells) + " |")
    md = "\n".join(lines) + (
        f"\n\nThe paper (Qwen3-8B, H200, bf16, 2048 new tokens): average {numbers.TABLE1[0.0]['average'][1]:.2f} tau / "
        f"{numbers.TABLE1[0.0]['average'][0]:.2f}x at T = 0, {numbers.TABLE1[1.0]['average'][1]:.2f} / "
        f"{numbers.TABLE1[1.0]['average'][0]:.2f}x at T = 1; EAGLE-3 (tree 16) {numbers.EAGLE3_TABLE1_AVERAGE[1]:.2f} / "
        f"{numbers.EAGLE3_TABLE1_AVERAGE[0]:.2f}x at T = 0.")
    main = res[s.main]
    t0, t1 = f"{min(o.temperatures):g}", f"{max(o.temperatures):g}"
    a0, a1 = main[t0]["average"], main[t1]["average"]
    finding = [f"tau {a0['tau']:.2f} at T = {t0} vs {a1['tau']:.2f} at T = {t1} (the paper: 6.49 -> 5.48, lower at "
               f"T = 1): " + ("the paper's direction" if a0["tau"] > a1["tau"] else "not the paper's direction")
               + ("" if _apart(a0, a1) else f", {_why(a0, a1)}")] if t0 != t1 else []
    order = sorted(o.datasets, key=lambda n: -main[t0]["datasets"][n]["tau"])
    porder = sorted([n for n in o.datasets if n in numbers.TABLE1[0.0]], key=lambda n: -numbers.TABLE1[0.0][n][1])
    fewest = min(main[t0]["datasets"][n]["responses"] for n in o.datasets)
    finding.append(f"prompt sets by tau at T = {t0}, here: {' > '.join(order)}; the paper: {' > '.join(porder)}"
                   + (" (MT-Bench, open chat, is the hardest in both)" if order[-1] == porder[-1] == "mt-bench" else "")
                   + ("" if metrics.interval_supported(fewest) else
                      f" (a set rests on {fewest} responses here, fewer than the {metrics.MIN_DISTINCT_SAMPLES} an "
                      "interval needs: an ordering, not a finding)"))
    results = {framework.recorded_path(d, "drafter"): v for d, v in res.items()}  # the same in every checkout
    out = {"results": results}
    e3 = None
    if s.eagle3 is not None:
        e3 = eagle3_columns(s)
        md += "\n\n" + eagle3_markdown(s, res, e3)
        finding += eagle3_findings(res[s.main]["0"]["average"] if "0" in res[s.main] else None, e3)
        out["eagle3"] = e3
    if o.repeats > 1:
        md += "\n\n" + runs_markdown(s, res, e3)
    return out | {"markdown": md, "findings": finding}  # the figure: table1_figure, from the JSON


def eagle3_columns(s: Session) -> dict:
    """EAGLE-3's chain and trees at T = 0 on table1's prompts: {column: {"datasets", "average",
    "block_size", "tree"}}."""
    o = s.opt
    bs = drafter_block_size(s.eagle3)
    out = {}
    for tree in [None] + [eagle3_tree(t) for t in o.eagle3_trees]:
        name = "chain" if tree is None else f"tree {tree[0]}"
        recs = s.grid([(EAGLE3_KEY, n, 0.0, bs, tree) for n in o.datasets], f"table1 EAGLE-3 {name} T=0")
        per = dict(zip(o.datasets, recs))
        out[name] = {"datasets": {n: _strip(r) for n, r in per.items()}, "average": _average(per),
                     "block_size": bs, "tree": list(tree) if tree else None}
    return out


def eagle3_markdown(s: Session, res: dict, e3: dict) -> str:
    """EAGLE-3's columns beside the main DFlash drafter's T = 0 column and the paper's."""
    o, d = s.opt, res[s.main].get("0")
    cols = list(e3)
    head = ("| prompt set | " + " | ".join(f"EAGLE-3 {c} ({_e3_setting(e3[c])}): speedup / tau" for c in cols)
            + (f" | {_name(s.main, s)} T=0 |" if d else " |")
            + " the paper, EAGLE-3 tree 16 | the paper, EAGLE-3 tree 60 | the paper, DFlash |")
    lines = [f"EAGLE-3 ({_eagle3_name(s)}) on the same prompts, T = 0:", "", head,
             "|" + "---|" * (head.count("|") - 1)]
    for n in list(o.datasets) + ["average"]:
        pick = lambda col: col["average"] if n == "average" else col["datasets"][n]
        cells = [f"{_ci(pick(e3[c]), 'speedup')}x / {_ci(pick(e3[c]), 'tau')}" for c in cols]
        if d:
            cells.append(f"{_ci(pick(d), 'speedup')}x / {_ci(pick(d), 'tau')}")
        avg = n == "average"
        cells += [f"{numbers.EAGLE3_TABLE1_AVERAGE[0]:.2f}x / {numbers.EAGLE3_TABLE1_AVERAGE[1]:.2f}" if avg else "-",
                  f"{EAGLE3_TREE60_SPEEDUP:.2f}x / -" if avg else "-",
                  "-" if numbers.TABLE1[0.0].get(n) is None else
                  f"{numbers.TABLE1[0.0][n][0]:.2f}x / {numbers.TABLE1[0.0][n][1]:.2f}"]
        lines.append(f"| {'**average**' if avg else n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + (
        f"\n\nThe paper's EAGLE-3 (Qwen3-8B, H200, T = 0, average): tree 16 {numbers.EAGLE3_TABLE1_AVERAGE[0]:.2f}x / "
        f"tau {numbers.EAGLE3_TABLE1_AVERAGE[1]:.2f}, tree 60 {EAGLE3_TREE60_SPEEDUP:.2f}x (tau not given); "
        "EAGLE-3's trees here: depth 7 (its steps), the topk best nodes of each depth expanded (docs/eagle3.md).")


EAGLE3_TREE60_SPEEDUP = 2.02
"""The paper's EAGLE-3 tree-60 average speedup (Qwen3-8B, T = 0; it gives no tau for it)."""


def _e3_setting(col: dict) -> str:
    steps = col["block_size"] - 1
    return f"{steps} steps" if not col["tree"] else f"top-{col['tree'][1]}, depth {steps}"


def _eagle3_name(s: Session) -> str:
    o = s.opt.eagle3
    return {RANDOM: "random weights: not a result", EMBEDDED_EAGLE3: "the shipped embedded-eagle3"}.get(
        o, os.path.basename(os.path.normpath(o)))


def eagle3_findings(dflash: dict | None, e3: dict) -> list[str]:
    """DFlash (T = 0) against each EAGLE-3 column, tau and speedup through the intervals, with the
    paper's ratios."""
    if dflash is None:
        return []
    out = []
    for name, col in e3.items():
        a = col["average"]
        for key in ("tau", "speedup"):
            paper = ""
            if name == "tree 16":
                p = numbers.EAGLE3_TABLE1_AVERAGE[key == "tau"], numbers.TABLE1[0.0]["average"][key == "tau"]
                paper = f"; the paper: {p[1]:.2f} vs {p[0]:.2f}, x{p[1] / p[0]:.2f}"
            elif name == "tree 60" and key == "speedup":
                paper = (f"; the paper: {numbers.TABLE1[0.0]['average'][0]:.2f}x vs {EAGLE3_TREE60_SPEEDUP:.2f}x, "
                         f"x{numbers.TABLE1[0.0]['average'][0] / EAGLE3_TREE60_SPEEDUP:.2f}")
            verdict = ("the intervals do not overlap" if _apart(dflash, a, key) else _why(dflash, a, key))
            out.append(f"T = 0, {key}: DFlash {dflash[key]:.2f} vs EAGLE-3 {name} {a[key]:.2f} "
                       f"(x{dflash[key] / a[key]:.2f}; {verdict}{paper})")
    return out


def runs_markdown(s: Session, res: dict, e3: dict | None) -> str:
    """Each run's own average decode speedup over the sets (the mean of its per-set speedups)
    and the load average before the run's first set."""
    cols = [(f"{_name(d, s)} T={t}", res[d][t]) for d in res for t in res[d]]
    cols += [(f"EAGLE-3 {c}", v) for c, v in (e3 or {}).items()]
    lines = [f"Speed per run ({s.opt.repeats} runs; the table's speedups use each response's decode time averaged "
             "over them):", "", "| column | " + " | ".join(f"run {i + 1}" for i in range(s.opt.repeats)) + " |",
             "|" + "---|" * (s.opt.repeats + 1)]
    for name, col in cols:
        runs = [col["datasets"][n].get("runs") for n in col["datasets"]]
        if not all(runs):
            continue
        cells = []
        for i in range(s.opt.repeats):
            sp = np.mean([r[i]["speedup"] for r in runs])
            load = runs[0][i].get("load_average_before")
            cells.append(f"{sp:.2f}x" + (f" (load {load[0]:.1f})" if load else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _why(a: dict, b: dict, key: str = "tau") -> str:
    """Why two averages' difference is not a finding: no interval (too few responses), or
    overlapping intervals."""
    why = framework.no_interval([{"average": a}, {"average": b}], key)
    return f"{why}: not a finding" if why else "within the 95 % intervals: not a finding"


def _apart(a: dict, b: dict, key: str = "tau") -> bool:
    return framework.separated({"average": a}, {"average": b}, key)


def _strip(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "samples"} | {"responses": r["turns"]}


def _name(d: str, s: Session) -> str:

    return "embedded drafter" if os.path.abspath(d) == os.path.abspath(EMBEDDED_DRAFTER_DIR) else os.path.basename(
        os.path.normpath(d))


def _drafter_label(recorded: str) -> str:
    """A table1 column's drafter as the figure names it (``results`` keys are recorded paths)."""
    return "embedded drafter" if recorded == framework.EMBEDDED else os.path.basename(os.path.normpath(recorded))


def table1_figure(record: dict):
    """table1.png from table1.json (``record``): speedup and tau per prompt set and on average,
    for every drafter and temperature (and EAGLE-3's columns where they ran) beside the paper's
    T = 0 row; 95 % intervals where they exist, the titles saying which
    (:func:`dflash_jax.figures.interval_label`)."""
    o, res, e3 = record["options"], record["results"], record.get("eagle3") or {}
    names = list(o["datasets"]) + ["average"]
    temps = [f"{t:g}" for t in o["temperatures"]]
    series = [(f"{_drafter_label(d)}, T={t}", res[d][t]) for d in res for t in temps if t in res[d]]
    series += [(f"EAGLE-3 {c}, T=0", col) for c, col in e3.items()]
    fewest = min((col["datasets"][n].get("responses", col["datasets"][n].get("turns")) for _, col in series
                  for n in o["datasets"]), default=None)
    fig, axes = new_figure(1, 2, figsize=(13, 4.8), layout="constrained")
    width = 0.8 / (len(series) + 1)
    for ax, key in zip(axes, ("speedup", "tau")):
        x = np.arange(len(names))
        errors = []
        for i, (label, col) in enumerate(series):
            rows = [col["average"] if n == "average" else col["datasets"][n] for n in names]
            v = np.array([r[key] for r in rows], float)
            errors.append(figures.interval_errors(v, [r[key + "_ci"] for r in rows]))
            ax.bar(x + (i - len(series) / 2) * width, v, width, yerr=errors[-1], capsize=2, label=label)
        paper = [numbers.TABLE1[0.0].get(n) for n in names]
        ax.bar(x + (len(series) / 2) * width, [np.nan if p is None else p[key == "tau"] for p in paper], width,
               color="0.7", label="the paper, T=0 (Qwen3-8B, H200)")
        ax.set_xticks(x, names)
        ax.set_ylabel("decode speedup (x)" if key == "speedup" else "tau")
        if key == "speedup":
            ax.axhline(1, color="k", lw=0.8)
        ax.set_title(f"Table 1: {key} ({o['target']} target, {record['preset']} preset, "
                     f"{figures.interval_label(errors, fewest)})")
    # one legend for both panels, under them: clear of every bar
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=min(len(series) + 1, 4),
               fontsize=7, frameon=False)
    return fig


def acceptance(s: Session) -> dict:
    """The acceptance-length histogram per prompt set and the per-position acceptance rate
    (T = 0, the drafter's block size): a figure; the measurements are table1's."""
    o = s.opt
    recs = dict(zip(o.datasets, s.grid([(s.main, n, 0.0, None) for n in o.datasets], "acceptance (T=0)")))
    bs = s.drafters[s.main].config.block_size
    out = {n: {"histogram": r["histogram"], "position_acceptance": r["position_acceptance"], "tau": r["tau"]}
           for n, r in recs.items()}
    full = {n: r["histogram"][-1] / max(sum(r["histogram"]), 1) for n, r in recs.items()}
    first = {n: r["position_acceptance"][0] for n, r in recs.items()}
    findings = ["P(first draft token accepted): " + ", ".join(f"{n} {p:.2f}" for n, p in first.items())
                + "; whole block accepted: " + ", ".join(f"{n} {p:.2f}" for n, p in full.items()),
                "the per-position acceptance falls with the position on every set, as it must (a position is "
                "accepted only when every earlier one is)" if all(
                    np.all(np.diff(r["position_acceptance"]) <= 1e-9) for r in recs.values()) else
                "the per-position acceptance is not monotone: a bug (position k needs every earlier one)",
                f"tau here {np.mean([r['tau'] for r in recs.values()]):.2f} on average over these sets (block {bs}); "
                "the paper's Qwen3-8B pair: 6.49 with block 16, so its histogram sits at far longer lengths"]
    return {"results": out, "findings": findings}  # the figure: acceptance_figure, from the JSON


def acceptance_figure(record: dict):
    """acceptance.png from acceptance.json: the acceptance-length histogram per prompt set and
    the per-position acceptance (block size: the histogram's length)."""
    recs = record["results"]
    bs = max(len(r["histogram"]) for r in recs.values())
    fig, (ax1, ax2) = new_figure(1, 2, figsize=(13, 4))
    width = 0.8 / len(recs)
    for i, (n, r) in enumerate(recs.items()):
        hist = np.asarray(r["histogram"], float)
        frac = hist / max(hist.sum(), 1)
        ax1.bar(np.arange(1, len(hist) + 1) + (i - (len(recs) - 1) / 2) * width, frac, width,
                label=f"{n} (tau {r['tau']:.2f})")
        ax2.plot(np.arange(1, len(r["position_acceptance"]) + 1), r["position_acceptance"], "o-", ms=3, label=n)
    ax1.set(xlabel="acceptance length (accepted drafts + bonus)", ylabel="fraction of iterations",
            title=f"acceptance lengths, block {bs}, T = 0")
    ax2.set(xlabel="draft position k", ylabel="P(draft token k accepted)", ylim=(0, 1.02),
            title="per-position acceptance")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    return fig


def block_size_curve(s: Session) -> dict:
    """tau and decode speedup against the inference block size for one drafter (T = 0)."""
    o = s.opt
    jobs = [(s.main, n, 0.0, b) for b in o.block_sizes for n in o.datasets]
    recs = s.grid(jobs, "block_size_curve (T=0)")
    res = {}
    for (_, n, _, b), r in zip(jobs, recs):
        res.setdefault(b, {})[n] = r
    table = {b: {"average": _average(per), "datasets": {n: _strip(r) for n, r in per.items()}} for b, per in res.items()}
    bs = sorted(table)
    lines = ["| block size | tau [95% CI] | speedup, decode [95% CI] | " + " | ".join(f"{n} tau" for n in o.datasets) + " |",
             "|" + "---|" * (3 + len(o.datasets))]
    for b in bs:
        a = table[b]["average"]
        lines.append(f"| {b} | {_ci(a, 'tau')} | {_ci(a, 'speedup')}x | "
                     + " | ".join(f"{table[b]['datasets'][n]['tau']:.2f}" for n in o.datasets) + " |")
    best = max(bs, key=lambda b: table[b]["average"]["speedup"])
    taus = [table[b]["average"]["tau"] for b in bs]
    first, last, top = table[bs[0]]["average"], table[bs[-1]]["average"], table[best]["average"]
    close = [b for b in bs if b != best and not _apart(top, table[b]["average"], "speedup")]
    peak = (f"{_why(top, table[close[0]]['average'], 'speedup')} against block {close[0]}" if close
            else "its interval clear of the others'")
    findings = [f"tau {'rises' if taus[-1] > taus[0] else 'does not rise'} with the block size ({taus[0]:.2f} at {bs[0]} "
                f"-> {taus[-1]:.2f} at {bs[-1]}; "
                + ("the intervals do not overlap" if _apart(first, last) else _why(first, last)) + "); "
                f"the speedup is highest at block {best} ({top['speedup']:.2f}x; {peak}): a longer block can only "
                "add accepted tokens, but costs a longer verify",
                "the paper (8-layer drafters, MATH-500): tau 5.09 at block 8 vs 6.33 at 16 for a drafter trained "
                "at 16: tau rises with the block size"]
    # the figure: block_size_curve_figure, from the JSON
    return {"results": table, "drafter_block_size": s.drafters[s.main].config.block_size,
            "markdown": "\n".join(lines), "findings": findings}


def _trained_block_size(record: dict) -> int | None:
    """The block size the measured drafter was trained at: recorded since the figure is drawn
    from the JSON; for an earlier record, the shipped drafter's (it measured the default)."""
    if record.get("drafter_block_size") is not None:
        return int(record["drafter_block_size"])
    if record["options"].get("drafter") in (None, framework.EMBEDDED):
        with open(os.path.join(EMBEDDED_DRAFTER_DIR, "config.json")) as f:
            return json.load(f).get("block_size")
    return None


def block_size_curve_figure(record: dict):
    """block_size_curve.png from block_size_curve.json: tau and the decode speedup against the
    inference block size, the average with its 95 % interval where it has one (the legend
    says which), each prompt set a dashed line."""
    table = {int(b): v for b, v in record["results"].items()}
    bs = sorted(table)
    trained = _trained_block_size(record)
    fewest = min((table[b]["average"].get("responses") for b in bs if table[b]["average"].get("responses") is not None),
                 default=None)
    fig, axes = new_figure(1, 2, figsize=(12, 4))
    for ax, key in zip(axes, ("tau", "speedup")):
        v = np.array([table[b]["average"][key] for b in bs])
        err = figures.interval_errors(v, [table[b]["average"][key + "_ci"] for b in bs])
        ax.errorbar(bs, v, yerr=err, marker="o", capsize=4, color="k",
                    label=f"average, {figures.interval_label(err, fewest)}")
        for n in record["options"]["datasets"]:
            ax.plot(bs, [table[b]["datasets"][n][key] for b in bs], ".--", alpha=0.6, label=n)
        ax.set(xlabel="inference block size", ylabel="tau" if key == "tau" else "decode speedup (x)", xticks=bs,
               title=f"{key} vs block size" + (f" (drafter trained at {trained})" if trained else ""))
        ax.legend(fontsize=7)
    return fig


# items whose figure is drawn from their JSON alone (training_curve's needs the runs' metrics)
FIGURES = {"table1": table1_figure, "acceptance": acceptance_figure, "block_size_curve": block_size_curve_figure}


def item_figure(record: dict, fig=None):
    """The figure of a paper item's JSON ``record`` (``fig``: the one the item drew itself, for
    training_curve), laid out and marked: a smoke run, a busy machine
    (:func:`dflash_jax.figures.report_notes`)."""
    if fig is None:
        fig = FIGURES[record["item"]](record)
    return figures.finish(fig, figures.report_notes(record))


CONTINUED_METRICS = "continued_metrics.jsonl"  # the first continued stage's metrics (older recipes name none)


def continued_stages(drafter_dir: str) -> list[tuple[str, str]]:
    """(label, metrics file) of each continued-training stage in the drafter's ``recipe.json``
    (its ``continued`` list, in training order): a stage names its ``metrics`` file and its
    ``label``; the first stage of an older recipe names neither (``CONTINUED_METRICS``)."""
    path = os.path.join(drafter_dir, "recipe.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        stages = json.load(f).get("continued", [])
    out = []
    for i, st in enumerate(stages):
        metrics = st.get("metrics", CONTINUED_METRICS if i == 0 else None)
        if metrics is None:
            raise ValueError(f"{path}: continued stage {i + 1} names no metrics file ('metrics')")
        out.append((st.get("label", "continued (five-style data)" if i == 0 else f"continued, stage {i + 1}"),
                    os.path.join(drafter_dir, metrics)))
    return out


def training_curve(s: Session | None, opt: Options) -> dict:
    """Held-out tau (real generation) against training steps, and the loss, from run metrics."""
    if opt.runs:
        runs = {os.path.basename(os.path.normpath(r)): _rows(os.path.join(r, "metrics.jsonl")) for r in opt.runs}
    else:  # the embedded drafter's shipped metrics: pretraining, the fine-tune, then each continued stage
        pre = _rows(os.path.join(EMBEDDED_DRAFTER_DIR, "training_metrics.jsonl"))
        fine = _rows(os.path.join(EMBEDDED_DRAFTER_DIR, "finetune_metrics.jsonl"))
        last = pre[-1]["step"] if pre else 0
        runs = {"embedded drafter: training": pre,
                "embedded drafter: fine-tune (tap convention)": [r | {"step": r["step"] + last} for r in fine]}
        last += fine[-1]["step"] if fine else 0
        for label, metrics in continued_stages(EMBEDDED_DRAFTER_DIR):  # on one step axis, in order
            rows = _rows(metrics)
            runs[f"embedded drafter: {label}"] = [r | {"step": r["step"] + last} for r in rows]
            last += rows[-1]["step"] if rows else 0
    if not any(r.get("eval_tau") is not None for rows in runs.values() for r in rows):
        raise ValueError("the runs have no held-out tau (eval_tau): train with --eval-every N (and held-out prompts)")
    fig, (ax1, ax2) = new_figure(1, 2, figsize=(12, 4))
    out = {}
    for name, rows in runs.items():
        ev = [(r["step"], r["eval_tau"]) for r in rows if r.get("eval_tau") is not None]
        ax1.plot(*zip(*ev), "o-", label=name) if ev else None
        ax2.plot([r["step"] for r in rows], [r["loss"] for r in rows], lw=0.8, label=name)
        out[name] = {"eval_tau": ev, "final_loss": rows[-1]["loss"] if rows else None, "steps": len(rows)}
    ax1.set(xlabel="training step", ylabel="held-out tau", title="held-out tau during training")
    ax2.set(xlabel="training step", ylabel="training loss", yscale="log", title="training loss")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    ev = [t for v in out.values() for _, t in v["eval_tau"]]
    tail = [t for _, t in list(out.values())[-1]["eval_tau"]]
    findings = [f"held-out tau {ev[0]:.2f} at the first measurement -> {ev[-1]:.2f} at the last; "
                + ("still rising at the end (more steps would help)" if len(tail) >= 2 and tail[-1] > tail[-2]
                   else "flat or falling at the end"),
                "the paper trains 6 epochs on 800K samples (docs/method.md section 5) and shows no curve and reports no "
                "numbers to compare with"]
    return {"results": out, "findings": findings, "figure": fig}


def _rows(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# ---------------------------------------------------------------------------- outputs
def _write(out: str, name: str, result: dict, opt: Options, preset: str, command: str) -> None:
    """``name``.png (drawn from the record as the JSON holds it: :func:`item_figure`), .md, then
    .json, which marks the item done."""
    os.makedirs(out, exist_ok=True)
    fig = result.pop("figure", None)
    record = {"item": name, "preset": preset, "smoke": preset in framework.SMOKE_PRESETS,
              "options": recorded_options(opt), "command": command, "environment": environment(),
              "load_average": load_average(), "time": time.strftime("%Y-%m-%d %H:%M:%S"), **result}
    save_figure(item_figure(json.loads(json.dumps(record)), fig), os.path.join(out, f"{name}.png"))
    if "markdown" in result:
        write_text(os.path.join(out, f"{name}.md"), f"`{command}`\n\n{result['markdown']}\n")
    write_json(os.path.join(out, f"{name}.json"), record)


def check_out(out: str, preset: str, opt: Options, overwrite: bool) -> None:
    """``--out`` may be new, empty, or hold paper outputs of the same options; anything else
    needs another --out (or --overwrite for paper outputs of other options)."""
    if not os.path.isdir(out) or not os.listdir(out):
        if os.path.exists(out) and not os.path.isdir(out):
            raise ValueError(f"--out {out!r} is a file, not a directory")
        return
    index = os.path.join(out, INDEX)
    if not os.path.exists(index):
        raise ValueError(f"--out {out!r} is a non-empty directory without {INDEX}: it does not hold these "
                         "tables and nothing in it is overwritten; give another --out")
    with open(index) as f:
        old = json.load(f)
    if _comparable(old.get("identity")) != _comparable(_identity(preset, opt)) and not overwrite:
        raise ValueError(f"--out {out!r} holds paper outputs of other options (preset {old.get('preset')!r}); give "
                         "another --out, or --overwrite to replace them")


def _identity(preset: str, opt: Options) -> dict:
    return {"preset": preset, "options": recorded_options(opt)}


def _comparable(identity):
    """An --out's identity as it is compared: by what decides the outputs, not by where the
    checkout is (the paths of an identity recorded in another checkout, or by an older
    version that recorded absolute paths, are written as :func:`recorded_options` writes them)."""
    if not isinstance(identity, dict) or not isinstance(identity.get("options"), dict):
        return identity
    out = json.loads(json.dumps(identity))
    o = out["options"]
    o["target"] = framework.recorded_path(o.get("target"), "target")
    drafter = framework.recorded_path(o.get("drafter"), "drafter")
    o["drafter"] = None if drafter == framework.EMBEDDED else drafter
    o["others"] = [framework.recorded_path(x, "drafter") for x in o.get("others") or []]
    o["runs"] = [framework.recorded_path(x) for x in o.get("runs") or []]
    for k in ("eagle3", "eagle3_trees", "repeats"):  # table1's EAGLE-3 columns and the runs per
        o.pop(k, None)  # measurement add to the outputs or steady them: outputs made without them are kept
    return out


def run(name: str, preset: str = "smoke", *, out: str | None = None, work: str | None = None,
        ablations_out: str | None = None, overwrite: bool = False, command: str | None = None,
        prompt_source: str | None = None, fresh: bool = False, verbose: bool = False, **overrides) -> dict:
    """Makes one item (``table1``, ``acceptance``, ``block_size_curve``, ``training_curve``) or
    ``all``; returns {item: result} (and {ablation: Table} for ``all``). ``overrides``: any
    :class:`Options` field; ``prompt_source``: the ablations' training prompts (their option).
    ``fresh``: measure again (and for ``all`` train and measure the ablations again) instead of
    reusing what ``work`` holds; ``verbose``: name every measurement reused
    (:class:`experiments.framework.WorkLog`)."""
    if name not in ITEMS + ("all", "readme"):
        raise ValueError(f"unknown item {name!r}; choose from {', '.join(ITEMS + ('all', 'readme'))}")
    if name == "readme" and fresh:
        raise ValueError("readme writes the page from saved outputs and computes nothing: --fresh does not apply "
                         "(rerun the items with --fresh, then readme)")
    opt = options(preset, **overrides)
    check(opt)
    out = out or default_out(preset)
    if name == "readme":  # the page alone, from what earlier runs saved
        check_out(out, preset, opt, overwrite)
        results, tables, missing = saved(out, preset, ablations_out)
        os.makedirs(out, exist_ok=True)
        write_text(os.path.join(out, "README.md"), readme(out, preset, opt, command or f"experiments.paper.run("
                                                          f"'readme', preset={preset!r})", results, tables, None,
                                                          ablations_out, missing))
        return results | tables
    work = work or framework.default_work()
    command = command or (f"experiments.paper.run({name!r}, preset={preset!r}, out={portable_path(out)!r}, "
                          f"work={portable_path(work)!r}" + "".join(f", {k}={v!r}" for k, v in overrides.items()) + ")")
    check_out(out, preset, opt, overwrite)
    names = ITEMS if name == "all" else (name,)
    if "table1" in names:
        check_eagle3(opt)
    # the ablations of ``all`` run on the same target (and need the training prompts for a real one)
    a_over = ({"target": opt.target} if not _embedded_target(opt) else {}) | (
        {"prompt_source": prompt_source} if prompt_source else {})
    if name == "all":  # every ablation's settings are checked before anything runs
        for a in ABLATIONS:
            framework.check_experiment(_ablation(a).EXPERIMENT, preset, a_over)
    t0 = time.perf_counter()
    if preset in framework.SMOKE_PRESETS:
        print(framework.smoke_note(preset), file=sys.stderr, flush=True)
    log = framework.WorkLog(work, fresh, verbose)  # one for the items and the ablations of `all`
    session = Session(opt, work, log) if any(n != "training_curve" for n in names) else None
    results = {}
    for n in names:
        r = training_curve(session, opt) if n == "training_curve" else globals()[n](session)
        _write(out, n, r, opt, preset, command)
        results[n] = r
        print(f"wrote {out}/{n}.*: " + "; ".join(r["findings"]), file=sys.stderr)
    tables = {}
    if name == "all":
        for a in ABLATIONS:
            exp = _ablation(a).EXPERIMENT
            a_out = os.path.join(ablations_out, a) if ablations_out else framework.default_out(exp, preset)
            argv = ["--preset", preset, "--out", a_out, "--work", work] + [
                x for k, v in a_over.items() for x in (framework.flag(k), str(v))]
            tables[a] = framework.run_experiment(exp, preset, out=a_out, work=work, overwrite=overwrite,
                                                 command=command_line(f"experiments.{a}", argv), log=log,
                                                 **a_over)
        write_text(os.path.join(out, "README.md"), readme(out, preset, opt, command, results, tables,
                                                          (time.perf_counter() - t0) / 60, ablations_out))
    write_json(os.path.join(out, INDEX), {"identity": _identity(preset, opt), "preset": preset, "command": command,
                                          "items": sorted(set(_done(out)) | set(names))})
    if log.summary():
        print(log.summary(), file=sys.stderr)
    return results | tables


def _done(out: str) -> list[str]:
    path = os.path.join(out, INDEX)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f).get("items", [])


def _ablation(name: str):
    return importlib.import_module(f"dflash_jax.experiments.{name}")


TITLES = {"table1": "Table 1: speedup and tau per prompt set, T = 0 and T = 1",
          "acceptance": "Acceptance lengths and per-position acceptance",
          "block_size_curve": "tau and speedup against the inference block size",
          "training_curve": "Held-out tau against training steps"}


def saved(out: str, preset: str, ablations_out: str | None) -> tuple[dict, dict, list[str]]:
    """What earlier runs left: ({item: its saved result}, {ablation: Table}, [commands of the
    items and ablations not made yet])."""
    results, tables, missing = {}, {}, []
    for n in ITEMS:
        path = os.path.join(out, f"{n}.json")
        if os.path.exists(path):
            with open(path) as f:
                results[n] = json.load(f)
        else:
            missing.append(f"python -m experiments.paper {n} --preset {preset}")
    for a in ABLATIONS:
        exp = _ablation(a).EXPERIMENT
        path = os.path.join(ablations_out, a) if ablations_out else framework.default_out(exp, preset)
        if os.path.exists(os.path.join(path, framework.TABLE)):
            with open(os.path.join(path, framework.TABLE)) as f:
                j = json.load(f)
            tables[a] = framework.Table(exp, j["preset"], j["settings"], j["budget"], j["rows"], j["command"],
                                        j["environment"], j["minutes"])
        else:
            missing.append(f"python -m experiments.{a} --preset {preset}")
    return results, tables, missing


def _loads(record) -> list[float]:
    """Every 1-minute load average a result recorded (``load_average`` / ``load_average_before``,
    at any depth)."""
    if isinstance(record, dict):
        found = [v[0] for k, v in record.items()
                 if isinstance(k, str) and k.startswith("load_average") and isinstance(v, list) and v]
        return found + [x for v in record.values() for x in _loads(v)]
    if isinstance(record, list):
        return [x for v in record for x in _loads(v)]
    return []


def _load_text(results: dict) -> str:
    """The load the measurements ran under, as the README states it."""
    loads = _loads(results)
    if not loads:
        return "load average not recorded"
    return f"1-minute load average {min(loads):.1f}-{max(loads):.1f} before the measurements"


def readme(out: str, preset: str, opt: Options, command: str, results: dict, tables: dict, minutes: float | None,
           ablations_out: str | None, missing: Sequence[str] = ()) -> str:

    env = environment()
    lines = [f"# The paper's tables and figures ({preset} preset)", ""]
    if preset in framework.SMOKE_PRESETS:
        lines += [f"**This is a smoke run**: {framework.SMOKE_NOTE.split(': ', 1)[1]}.", ""]
    lines += [f"Command: `{command}`" + ("" if minutes is None else
                                       f" ({minutes:.1f} minutes for this invocation; measurements and cells reused "
                                       "from earlier runs cost nothing here)") + ".", "",
             f"Machine: {env['device']} ({env['platform']}, {cpu_model() or ''}, {os.cpu_count()} cores), "
             f"jax {env['jax']}; {_load_text(results)}. Pair: target `{_show(opt.target)}`, "
             f"drafter `{_show(opt.drafter) if opt.drafter else 'embedded'}`.", "",
             f"Budget: {', '.join(opt.datasets)}; {opt.max_samples} prompts per set, {opt.max_new_tokens} new tokens, "
             "batch 1, AR and DFlash interleaved per prompt (the `bench` protocol)"
             + (f", every measurement run {opt.repeats} times (speed from each response's decode times averaged "
                "over the runs; each run's own speedup and load in table1)" if opt.repeats > 1 else "")
             + (f"; EAGLE-3 ({opt.eagle3}) in table1 at T = 0: its chain and trees {', '.join(opt.eagle3_trees)}"
                if opt.eagle3 != NO_EAGLE3 else "") + ". tau: per response the mean "
             "acceptance length, then the mean over responses; speedup: decode-only (docs/method.md section 6); [95% CI]: "
             f"percentile bootstrap over prompts, seed 0; none where it would rest on fewer than "
             f"{metrics.MIN_DISTINCT_SAMPLES} responses.", "",
             "The paper's numbers are for Qwen3-8B on an H200 in bf16 with 2048 new tokens; ours for the pair "
             "above. Compare directions, not magnitudes.", ""]
    for n, r in results.items():
        lines += [f"## {TITLES[n]}", "", f"`python -m experiments.paper {n} --preset {preset}`", ""]
        if "markdown" in r:
            lines += [r["markdown"], ""]
        lines += [f"![{n}]({n}.png)", ""] + [f"- {x}" for x in r["findings"]] + [""]
    if tables:
        lines += ["## Ablations", "", "Each ablation's own README has its table, budget, plot and the paper's rows.", ""]
        for a, t in tables.items():
            rel = os.path.relpath(os.path.join(ablations_out, a) if ablations_out else
                                  framework.default_out(t.experiment, preset), out)
            lines += [f"### {a}", "", f"`python -m experiments.{a} --preset {preset}` -> [{rel}]({rel}/README.md)", "",
                      t.experiment.description, "", t.to_markdown(), "", f"![{a}]({rel}/plot.png)", ""]
            lines += [f"- {x}" for x in t.experiment.findings(t)] + [""]
    if missing:
        lines += ["## Not made yet", "", "These had not finished when this page was written; each command resumes "
                  "where its run stopped, and `python -m experiments.paper all` runs whatever is left and writes "
                  "this page again:", ""] + [f"- `{m}`" for m in missing] + [""]
    return "\n".join(lines)


def _show(path: str) -> str:
    return framework.recorded_path(path, "target")


# ---------------------------------------------------------------------------- command line
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.paper", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("item", choices=ITEMS + ("all", "readme"),
                   help="the table or figure to make; all: every one and every ablation, then README.md; readme: "
                        "README.md alone from what earlier runs saved (listing what is not made yet)")
    p.add_argument("--preset", choices=tuple(PRESETS), default="cpu",
                   help="smoke: seconds; test: smoke's sizes on prompts of the experiments' test preset's shape "
                        "(the test suite's); cpu: the embedded pair, minutes (default); gpu: the paper's sizes")
    p.add_argument("--out", help="output directory (default: $DFLASH_JAX_HOME/results/paper for cpu, .../paper-<preset> "
                                 "otherwise; DFLASH_JAX_HOME defaults to ~/.cache/dflash-jax). The committed results "
                                 "are rewritten only by an explicit --out results/paper (with --ablations-out "
                                 "results/ablations for all)")
    p.add_argument("--work", help="measurement cache and the ablations' run directory (default "
                                  "$DFLASH_JAX_HOME/work, shared with the experiments)")
    p.add_argument("--ablations-out", help="all: write the ablations under this directory (default: each one's own "
                                           "default, $DFLASH_JAX_HOME/results/ablations/<name>[-<preset>])")
    p.add_argument("--overwrite", action="store_true", help="replace outputs made with other options")
    framework.add_reuse_options(p)
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.add_argument("--target", help="Hugging Face target directory (default: embedded, the target shipped in the "
                                    "package)")
    p.add_argument("--drafter", help="DFlash drafter directory (default: embedded, the drafter shipped in the "
                                     "package)")
    p.add_argument("--others", nargs="+", help="more drafter directories: one more column each in table1")
    p.add_argument("--eagle3", help="table1's EAGLE-3 drafter: " + NAMES_HELP + ", or 'none' (no EAGLE-3 columns; "
                                    "default: embedded-eagle3 for cpu, none for smoke, test and gpu)")
    p.add_argument("--eagle3-trees", nargs="*", help="table1's EAGLE-3 trees beside its chain, N:TOPK each "
                                                     "(default 16:4 60:10, the paper's 16 and 60 nodes)")
    p.add_argument("--repeats", type=int, help="timed runs of every measurement, their decode times averaged "
                                               "(default: cpu 3, smoke, test and gpu 1)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="compute dtype (default: float32 on CPU)")
    p.add_argument("--datasets", nargs="+", choices=list(DATASETS), help="prompt sets (default: all five; smoke, test: two)")
    p.add_argument("--max-samples", type=int, help="prompts per set (smoke and test 1, cpu 6, gpu 128)")
    p.add_argument("--max-new-tokens", type=int, help="new tokens per prompt (smoke and test 16, cpu 96, gpu 2048)")
    p.add_argument("--temperatures", nargs="+", type=float, help="table1's temperatures (default 0 1)")
    p.add_argument("--block-sizes", nargs="+", type=int, help="block_size_curve's block sizes (smoke, test: 4 16; cpu: "
                                                              "4 8 16; gpu: 4 8 12 16)")
    p.add_argument("--subset", choices=list(SUBSETS), help="which prompts of a set (as bench --subset)")
    p.add_argument("--seed", type=int, help="prompt subset and sampling seed (default 0; test: 1)")
    p.add_argument("--runs", nargs="+", help="training_curve: drafter run directories (default: the embedded "
                                             "drafter's shipped metrics)")
    p.add_argument("--prompt-source", help="all: the ablations' training prompts (their --prompt-source; needed "
                                           "with a real --target)")
    return p


def main(argv: Sequence[str] | None = None) -> dict:

    owns_process = argv is None  # the command line: Ctrl-C handling, the compilation cache (run_cli)
    argv = list(sys.argv[1:] if argv is None else argv)
    result = {}

    def go(a):
        args = parser().parse_args(a)
        fields = [f.name for f in dataclasses.fields(Options)]
        overrides = {k: getattr(args, k) for k in fields if getattr(args, k, None) is not None}
        result.update(run(args.item, args.preset, out=args.out, work=args.work, ablations_out=args.ablations_out,
                          overwrite=args.overwrite, command=command_line("experiments.paper", a),
                          prompt_source=args.prompt_source, fresh=args.fresh, verbose=args.verbose, **overrides))

    run_cli(go, argv, owns_process=owns_process)
    return result


if __name__ == "__main__":
    main()
