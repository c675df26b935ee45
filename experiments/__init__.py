"""Ablation and paper-figure scripts, run as ``python -m experiments.<name>``."""
