"""The DFlash family's roofline (``dflash_jax.tools.roofline_methods``, ``roofline --family``):
each method's draft is its own size model's, the verify the dense roofline's target pass, the
Markov head's sequential reads counted per row by hand, the predicted speedup tau / ratio, and
the report written by the command line."""

from __future__ import annotations

import json
import os

import pytest

from dflash_jax.tools import roofline, roofline_methods as rm
from dflash_jax.tools.roofline import DEVICES

pytestmark = pytest.mark.xdist_group("test_roofline_methods")


def test_the_report_by_hand(tmp_path):
    report = roofline.main(["--family", "--out", str(tmp_path), "--context", "1024"])
    assert sorted(os.listdir(tmp_path)) == sorted(f"methods_qwen3-8b_S1024_b1.{e}" for e in ("json", "md", "png"))
    assert json.loads((tmp_path / "methods_qwen3-8b_S1024_b1.json").read_text())["benchmark"] == "roofline_methods"
    name, target, dflash = roofline.load_pair(type("A", (), {"target": None, "drafter": None, "name": None,
                                                             "drafter_layers": 5})())
    for dev in ("h100", "b200"):
        a, device = report["analysis"][dev], DEVICES[dev]
        rows = a["methods"]
        # DSpark's Markov head: 7 (block 7) or 15 (block 15) sequential steps, one per drafted row, each
        # reading w2 [256, V] in bf16; the FLOPs (2 r V per row) are far below the bandwidth's time
        for label, drafted in (("dspark b7", 7), ("dspark b15", 15)):
            assert rows[label]["components_ms"]["Markov head"] == pytest.approx(
                drafted * 256 * target.vocab_size * 2 / device.bandwidth * 1e3, rel=0.02)
        # Domino's correction: 14 corrected drafts (15 drafts, one uncorrected), each reading W1
        # [D + 1024, 256] and W2 [256, V] in bf16; the GRU: 15 steps reading [D + 1024, 3072]
        D, V = target.hidden_size, target.vocab_size
        assert rows["domino"]["components_ms"]["Domino correction"] == pytest.approx(
            14 * ((D + 1024) * 256 + 256 * V) * 2 / device.bandwidth * 1e3, rel=0.02)
        assert rows["domino"]["components_ms"]["Domino GRU"] == pytest.approx(
            15 * (D + 1024) * 3072 * 2 / device.bandwidth * 1e3, rel=0.02)
        assert rows["domino"]["t_verify_ms"] == rows["dflash"]["t_verify_ms"]
        # the same backbone: DFlash2 and DSpark add to DFlash's draft, the verify of 16 rows is one
        assert rows["dflash"]["t_draft_ms"] < rows["dflash2"]["t_draft_ms"] < rows["dspark b15"]["t_draft_ms"]
        assert rows["dflash"]["t_verify_ms"] == rows["dspark b15"]["t_verify_ms"] == rows["dflash2"]["t_verify_ms"]
        t_iter = roofline.seconds(roofline.dflash_iteration(target, dflash, 16, 1024), device) * 1e3
        assert rows["dflash"]["t_draft_ms"] + rows["dflash"]["t_verify_ms"] == pytest.approx(t_iter, rel=1e-9)
        assert a["predicted_speedup"]["dspark b7 at 6.17 (GSM8K, T = 1)"] == pytest.approx(
            6.17 / rows["dspark b7"]["ratio"])
        assert a["tau_to_match_dflash"]["dflash"] == pytest.approx(6.49)
    with pytest.raises(ValueError, match="--family models dense targets"):
        roofline.main(["--family", "--eagle3", "--out", str(tmp_path)])
    assert rm.PUBLISHED["dspark gsm8k T=1"]["tau"] == 6.17
