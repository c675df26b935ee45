"""The shipped drafter on the quantized embedded target: ``bench`` runs of one pair with the target
in float32, int8 and FP8 (``bench --quantize``), put side by side: tau per prompt set with its
95 % bootstrap interval, and the paired difference of each quantized target's tau from the
float32 one's (the same prompts in every run: per response, bootstrapped over the responses),
with the AR step's time. Writes ``quantized.json``, ``README.md`` and ``quantized.png``
(docs/quantization.md).

  python -m dflash_jax.tools.quantized_report --runs float32=DIR int8=DIR fp8=DIR --out DIR
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from dflash_jax import metrics
from dflash_jax.figures import interval_errors, interval_label
from dflash_jax.files import write_json, write_text
from dflash_jax.reporting import command_line, cpu_description, new_figure, write_report


def compare(runs: dict[str, dict]) -> dict:
    """The table's numbers: per set and on average, each run's tau (its interval as bench
    computed it) and AR ms/token, and each run's paired tau difference from the first run."""
    names = list(runs)
    base = runs[names[0]]
    sets = list(base["datasets"])
    out = {"runs": names, "sets": {}, "average": {}}
    for s in sets:
        row = {}
        for n in names:
            d = runs[n]["datasets"][s]
            row[n] = {"tau": d["tau"], "tau_ci": d["tau_ci"], "responses": d["responses"],
                      "ar_ms_per_token": d["ar_decode_ms_per_token"],
                      "same_output": d["same_output"]}
        out["sets"][s] = row
    for n in names:
        a = runs[n]["average"]
        out["average"][n] = {"tau": a["tau"], "tau_ci": a["tau_ci"]}
    for n in names[1:]:  # paired differences from the first run, per set and pooled over the sets
        try:
            change = metrics.paired_tau_change(base, runs[n])
        except ValueError as e:
            raise ValueError(f"{n}: {e}: compare runs of one bench command with only --quantize changed") from e
        for s in sets:
            out["sets"][s][n]["tau_diff"], out["sets"][s][n]["tau_diff_ci"] = change["sets"][s]
        out["average"][n]["tau_diff"], out["average"][n]["tau_diff_ci"] = change["average"]
    return out


def _fmt(v, ci) -> str:
    return metrics.interval_text(v, ci) if ci is not None else f"{v:.2f}"


def markdown(report: dict) -> str:
    t = report["table"]
    names = t["runs"]
    head = ["set"] + [f"tau, {n} [95% CI]" for n in names] + [f"{n} - {names[0]} [95% CI]" for n in names[1:]] \
        + [f"AR ms/token, {n}" for n in names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s, row in list(t["sets"].items()) + [("**average**", t["average"])]:
        cells = [s] + [_fmt(row[n]["tau"], row[n]["tau_ci"]) for n in names]
        cells += [_fmt(row[n]["tau_diff"], row[n]["tau_diff_ci"]) for n in names[1:]]
        cells += [f"{row[n]['ar_ms_per_token']:.2f}" if "ar_ms_per_token" in row[n] else "" for n in names]
        lines.append("| " + " | ".join(cells) + " |")
    runs = report["runs"]
    env = report
    loads = ", ".join(f"{n} {runs[n]['load_average_before'][0]:.2f}" for n in names)
    return "\n".join([
        "# The shipped drafter on the quantized embedded target",
        "",
        "The embedded pair's default `bench` with the target's linear layers in float32, int8 and FP8 "
        "(`--quantize`; the drafter, trained on the float32 target, is unchanged): tau per response then "
        "averaged, 95 % percentile bootstrap intervals over the responses; the differences are paired "
        "(the same prompts in every run). Made by `python -m dflash_jax.tools.quantized_report`.",
        "",
        *lines,
        "",
        f"Commands: {'; '.join('`' + runs[n]['command'] + '`' for n in names)}.",
        f"Machine: {cpu_description(env['cpu'])}; 1-minute load average before each run: {loads}"
        + (" (a busy machine: other processes took CPU time, so the AR times are only indicative; tau does not "
           "depend on it)." if any(runs[n]["busy_warning"] for n in names) else "."),
        "",
    ])


def plot(report: dict):
    t = report["table"]
    names, sets = t["runs"], list(t["sets"]) + ["average"]
    fig, (a, b) = new_figure(1, 2, figsize=(12, 4.2))
    x = np.arange(len(sets))
    width = 0.8 / len(names)
    errs = []
    for i, n in enumerate(names):
        rows = [t["sets"][s][n] if s != "average" else t["average"][n] for s in sets]
        vals = [r["tau"] for r in rows]
        err = interval_errors(vals, [r["tau_ci"] for r in rows])
        errs.append(err)
        a.bar(x + (i - (len(names) - 1) / 2) * width, vals, width, yerr=err, capsize=3, label=n)
    a.set_xticks(x, sets)
    a.set_ylabel(f"tau ({interval_label(errs)})")
    a.set_title("tau of the shipped drafter by target precision")
    a.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=len(names))
    errs = []
    for i, n in enumerate(names[1:]):
        rows = [t["sets"][s][n] if s != "average" else t["average"][n] for s in sets]
        vals = [r["tau_diff"] for r in rows]
        err = interval_errors(vals, [r["tau_diff_ci"] for r in rows])
        errs.append(err)
        b.bar(x + (i - (len(names) - 2) / 2) * (0.8 / max(1, len(names) - 1)), vals, 0.8 / max(1, len(names) - 1),
              yerr=err, capsize=3, label=f"{n} - {names[0]}")
    b.axhline(0, color="black", linewidth=0.8)
    b.set_xticks(x, sets)
    b.set_ylabel(f"tau difference, paired ({interval_label(errs)})")
    b.set_title(f"tau change against the {names[0]} target")
    b.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=max(1, len(names) - 1))
    return fig


def timing(runs: dict[str, list[dict]]) -> dict:
    """Per run name (several bench runs each, e.g. three rounds alternated) and set: the AR and
    DFlash decode ms/token and the decode speedup of every run, with their medians."""
    out = {}
    for name, benches in runs.items():
        for s in benches[0]["datasets"]:
            per = [b["datasets"][s] for b in benches]
            row = {k: [float(p[k]) for p in per] for k in ("ar_decode_ms_per_token", "dflash_decode_ms_per_token",
                                                          "speedup")}
            row |= {f"{k}_median": float(np.median(v)) for k, v in list(row.items())}
            row["load_average_before"] = [b["load_average_before"][0] for b in benches]
            out.setdefault(name, {})[s] = row
    return out


def timing_markdown(table: dict, benches: dict[str, list[dict]]) -> str:
    names = list(table)
    lines = ["# Decode times of the embedded pair by target precision", "",
             f"{len(benches[names[0]])} bench runs per precision, alternated ({', '.join(names)}, then again); "
             "per set the median over the runs and every run's value. AR and DFlash: decode ms per output token; "
             "speedup: AR / DFlash, decode only. Made by `python -m dflash_jax.tools.quantized_report --timing`.", "",
             "| precision | set | AR ms/token, median (runs) | DFlash ms/token, median (runs) | speedup, median (runs) |",
             "|---|---|---|---|---|"]
    for n in names:
        for s, r in table[n].items():
            cell = lambda k: f"{r[k + '_median']:.2f} ({', '.join(f'{x:.2f}' for x in r[k])})"
            lines.append(f"| {n} | {s} | {cell('ar_decode_ms_per_token')} | {cell('dflash_decode_ms_per_token')} | "
                         f"{cell('speedup')} |")
    first = benches[names[0]][0]
    loads = sorted(x for n in names for r in table[n].values() for x in r["load_average_before"])
    command = first["command"].split(" --quantize ")[0]
    lines += ["", f"Command of each run: `{command} --quantize Q --out DIR`.",
              f"Machine: {cpu_description(first['cpu'])}; 1-minute load average before the runs {loads[0]:.2f} to "
              f"{loads[-1]:.2f} (mostly the previous run's own: they ran back to back).", ""]
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m dflash_jax.tools.quantized_report", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", nargs="+", metavar="NAME=DIR",
                   help="bench output directories, the reference first (e.g. float32=results/quantized/bench-none)")
    p.add_argument("--timing", nargs="+", metavar="NAME=DIR",
                   help="instead: repeated bench runs (a NAME once per run) for the decode-time table "
                        "(timing.json, timing.md)")
    p.add_argument("--out", required=True, help="directory for quantized.json, README.md and quantized.png")
    args = p.parse_args(argv)
    if bool(args.runs) == bool(args.timing):
        p.error("give --runs (the tau comparison) or --timing (repeated runs), not both")
    if args.timing:
        benches: dict[str, list[dict]] = {}
        for item in args.timing:
            name, _, path = item.partition("=")
            if not path or not os.path.exists(os.path.join(path, "bench.json")):
                p.error(f"--timing {item!r}: give NAME=DIR with a bench.json in DIR")
            with open(os.path.join(path, "bench.json")) as f:
                benches.setdefault(name, []).append(json.load(f))
        table = timing(benches)
        os.makedirs(args.out, exist_ok=True)
        write_json(os.path.join(args.out, "timing.json"), table)
        text = timing_markdown(table, benches)
        write_text(os.path.join(args.out, "timing.md"), text)
        print(text)
        return {"timing": table}
    runs = {}
    for item in args.runs:
        name, _, path = item.partition("=")
        if not path or not os.path.exists(os.path.join(path, "bench.json")):
            p.error(f"--runs {item!r}: give NAME=DIR with a bench.json in DIR")
        with open(os.path.join(path, "bench.json")) as f:
            runs[name] = json.load(f)
    ref = runs[next(iter(runs))]
    # the report holds what its table, text and figure are drawn from (tools/replot.py redraws it)
    report = {"command": command_line("dflash_jax.tools.quantized_report", argv), "table": compare(runs),
              "runs": {n: {k: r[k] for k in ("command", "load_average_before", "busy_warning")}
                       for n, r in runs.items()},
              "cpu": ref["cpu"], "environment": ref["environment"],
              "load_average_before": min((r["load_average_before"] for r in runs.values()), key=lambda x: x[0]),
              "busy_warning": next((r["busy_warning"] for r in runs.values() if r["busy_warning"]), None)}
    write_report(report, args.out, "quantized", plot, quiet=True)
    write_text(os.path.join(args.out, "README.md"), markdown(report))
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
