"""``--tree N`` on the command line (``generate``, ``bench``; ``decoding/tree_args.py``) and the
``tree-verify-cost`` tool (``tools/tree_verify_cost.py``), on a tiny random pair.

Oracles: plain autoregressive decoding (greedy tree decoding must reproduce it token for
token, through the commands as through the library); the refusals are the commands' own
errors, read from their output.
"""

import json

import pytest

from support.tiny_models import save_chat_target

pytestmark = [pytest.mark.xdist_group("test_tree_bench"), pytest.mark.slow]

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(target dir, drafter dir): a tiny random Qwen3 target with the embedded tokenizer and a
    1-layer block-4 drafter (tree depth at most 3)."""
    return save_chat_target(str(tmp_path_factory.mktemp("tree_pair")), TEMPLATE)


def _error(capsys, argv) -> str:
    """The one-line error of ``python -m dflash_jax <argv>`` (exit status 2)."""
    from dflash_jax.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("command", ["generate", "bench"])
def test_tree_options_are_refused_with_a_clear_error(command, tmp_path, capsys):
    """Refused before anything is loaded (the checkpoints named need not exist)."""
    target, drafter = str(tmp_path / "no_target"), str(tmp_path / "no_drafter")
    base = ["--target", target, "--drafter", drafter] + (["--prompt", "hi"] if command == "generate" else [])
    err = _error(capsys, [command, *base, "--tree", "1"])
    assert "--tree 1: a tree needs at least 2 nodes" in err
    assert "--tree 0: a tree needs at least 2 nodes" in _error(capsys, [command, *base, "--tree", "0"])
    err = _error(capsys, [command, *base, "--tree", "8", "--block-size", "adaptive"])
    assert "--tree with --block-size adaptive" in err and "pass one of them" in err
    assert "--tree-topk 2 needs --tree N" in _error(capsys, [command, *base, "--tree-topk", "2"])
    assert "--tree-topk 0: a node needs at least 1 child" in _error(
        capsys, [command, *base, "--tree", "8", "--tree-topk", "0"])
    if command == "generate":  # bench always has a drafter (the embedded one by default)
        err = _error(capsys, ["generate", "--target", target, "--prompt", "hi", "--tree", "8"])
        assert "--tree needs --drafter" in err


def test_tree_options_reach_generate_as_keywords():
    from dflash_jax.bench import harness
    from dflash_jax.decoding import tree_args

    args = harness.parser().parse_args(["--tree", "32"])
    assert tree_args.options(args) == {"tree": 32, "tree_topk": 4} and tree_args.label(args) == "DFlash tree 32"
    args = harness.parser().parse_args(["--tree", "16", "--tree-topk", "2"])
    assert tree_args.options(args) == {"tree": 16, "tree_topk": 2}
    assert tree_args.label(args) == "DFlash tree 16, top-2"
    args = harness.parser().parse_args([])
    assert tree_args.options(args) == {} and tree_args.label(args) == "DFlash"


def test_generate_tree_command_equals_autoregressive(pair, capsys):
    """``generate --tree 8`` prints what greedy autoregressive decoding gives (the library's AR
    run of the same ids), verifies 8 rows per iteration and says so."""
    import dflash_jax as dj
    from dflash_jax.decoding import cli

    target_dir, drafter_dir = pair
    prompts = ["Tom has 3 apples", "def add(a, b):"]
    argv = ["--target", target_dir, "--drafter", drafter_dir, "--max-new-tokens", "8", "--tree", "8"]
    r = cli.main([*argv, *[x for p in prompts for x in ("--prompt", p)]])
    out = capsys.readouterr()
    target = dj.load_target(target_dir)
    tok = target.tokenizer
    ref = dj.generate(target, [tok.encode(p) for p in prompts], 8, stop_token_ids=target.stop_token_ids)
    assert r.sequences == ref.sequences
    assert out.out == "".join(tok.decode(s) + "\n" for s in ref.sequences)
    assert "compiling and running DFlash tree 8 generation" in out.err
    assert "(mean acceptance length, tree of 8 nodes)" in out.err
    assert all(v == 8 for row in r.verify_lengths for v in row) and r.verify_lengths[0]
    assert all(1 <= a <= 4 for row in r.acceptance_lengths for a in row)  # depth <= block 4 - 1


def test_tree_bench_runs_bench_with_the_tree_column(pair, tmp_path):
    """``tree-bench``: ``bench`` for the chain and ``--tree 8`` (the DFlash column the tree,
    labelled so, equal to AR on every prompt, no adaptive table; the metrics recomputed by numpy,
    bench_checks), twice; the summary's tau the same in both runs, and its tau curve in the
    form the tree roofline reads (read back by ``roofline_tree.read_tau_curve``)."""
    from support.bench_checks import check_report

    from dflash_jax.tools import roofline_tree, tree_bench

    target_dir, drafter_dir = pair
    report = tree_bench.main(["--target", target_dir, "--drafter", drafter_dir, "--datasets", "gsm8k",
                              "--max-samples", "2", "--max-new-tokens", "6", "--nodes", "8", "--runs", "2",
                              "--out", str(tmp_path)])
    for run in ("run1", "run2"):
        for name in ("chain", "tree8"):
            saved = json.loads((tmp_path / run / name / "bench.json").read_text())
            check_report(saved)
            st = saved["settings"]
            assert st["tree"] == (8 if name == "tree8" else None) and st["adaptive"] is False
            assert "average_adaptive" not in saved
            rec = saved["datasets"]["gsm8k"]
            assert rec["same_output"] == rec["turns"] == 2
    md = (tmp_path / "run1" / "tree8" / "bench.md").read_text()
    assert "| DFlash tree 8 ms/token |" in md and "DFlash tree 8 == AR" in md and "(tree 8)" in md
    assert "adaptive block size" not in md
    assert "| DFlash ms/token |" in (tmp_path / "run1" / "chain" / "bench.md").read_text()
    res = report["results"]
    assert list(res) == ["chain", "tree8"]
    for r in res.values():
        assert r["tau_runs"][0] == r["tau_runs"][1] == r["tau"] and 1 <= r["tau"] <= 4  # block 4
        assert len(r["speedup_runs"]) == 2 and r["speedup_min"] <= r["speedup"] <= r["speedup_max"]
        assert r["same_output_as_ar"] and r["responses"] == 2 and r["block_size"] == 4
    curve = roofline_tree.read_tau_curve(str(tmp_path / "tau_curve.json"))
    assert curve.chain == res["chain"]["tau"] and curve.trees == {8: res["tree8"]["tau"]}
    md = (tmp_path / "tree_bench.md").read_text()
    assert "| chain, block 4 | 4 |" in md and "| tree 8 | 8 |" in md
    assert (tmp_path / "tree_bench.png").stat().st_size > 1000


def test_tree_verify_cost_report(pair, tmp_path):
    """The tool's JSON: every field, positive times, ratios near 1 (the same rows with and
    without the mask), trees of exactly N valid nodes no deeper than the drafter's block allows,
    the N = 8 one a real tree (not a chain); the iteration timings of the chain and each tree."""
    from dflash_jax.tools import tree_verify_cost

    target_dir, drafter_dir = pair
    report = tree_verify_cost.main(["--target", target_dir, "--drafter", drafter_dir, "--nodes", "8",
                                    "--calls", "2", "--repeats", "2", "--iterations", "2", "--context", "16",
                                    "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "tree_verify_cost.json").read_text())
    assert saved["results"] == json.loads(json.dumps(report["results"]))
    assert set(saved) >= {"benchmark", "command", "settings", "results", "machine", "env", "time"}
    assert saved["machine"]["cpu"]["cores"] and saved["machine"]["load_average_before"] is not None
    st = saved["settings"]
    assert st["nodes"] == [8] and st["tree_topk"] == 4 and st["max_depth"] == 3 and st["repeats"] == 2
    verify = saved["results"]["verify"]
    assert [e["nodes"] for e in verify] == [8]
    for e in verify:
        for kind in ("chain_ms", "tree_ms"):
            assert len(e[kind]["runs"]) == 2 and all(t > 0 for t in e[kind]["runs"])
            assert e[kind]["min"] <= e[kind]["median"] <= e[kind]["max"]
        assert e["ratio"] == pytest.approx(e["tree_ms"]["median"] / e["chain_ms"]["median"])
        assert 0.1 < e["ratio"] < 10 and 0.1 < e["paired_ratio"]["median"] < 10
        shape = e["tree"]
        assert shape["valid_nodes"] == sum(shape["nodes_per_depth"]) == e["nodes"]
        assert shape["nodes_per_depth"][0] == 1 and shape["max_depth"] <= 3
    assert verify[0]["tree"]["max_depth"] < 7 and verify[0]["tree"]["leaves"] > 1  # branches
    it = saved["results"]["iteration"]
    assert list(it) == ["chain, block 4", "tree 8"]
    assert it["chain, block 4"]["over_chain"] == pytest.approx(1.0)
    assert all(v["median"] > 0 and len(v["runs"]) == 2 for v in it.values())
    md = (tmp_path / "tree_verify_cost.md").read_text()
    assert "| N | chain ms |" in md and "Whole decode-loop iteration" in md
    assert (tmp_path / "tree_verify_cost.png").stat().st_size > 1000


def test_tree_verify_cost_refuses_a_one_node_tree(capsys):
    err = _error(capsys, ["tree-verify-cost", "--nodes", "1", "8"])
    assert "--nodes [1, 8]: a tree needs at least 2 nodes" in err
