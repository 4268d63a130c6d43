"""What limits a double sigmoid learner on elec2: the loss, not rho and not the step.

Usage: ``python loadtest/elec2_loss.py [--steps 0.1,0.3,1,3] [--radii 4,8,16] [--tails 0.5,2]
[--restarts 1000]``. The
electricity stream in its order, every label, inputs standardised by every event so far plus
an intercept, plain stochastic gradient steps of constant size ``eta`` on:

* the double sigmoid loss with rho learned (the paper's update);
* the double sigmoid loss with rho held at ``ln((1 - d) / d)``, Chow's width in logit units
  (what River's LR with Chow's rule rejects with);
* the logistic loss with the same rho held: River's LR with Chow's rule, written out.

Prints the risk (d = 0.25), the share rejected and the median abs(w . x) of each. The double
sigmoid's gradient vanishes on an example it is confidently wrong about, which is what a
moving boundary makes; the logistic's does not. With ``--radii``, a second table: the double
sigmoid with rho learned and ``w`` held in a ball of each radius (projected after every step,
rho scaled with it), which keeps ``|w . x|`` where the loss still has a gradient. With
``--tails``, a third: rho learned by the double sigmoid as before, ``w`` by the double sigmoid
plus ``lambda`` times the logistic loss (a convex tail: its gradient does not vanish where the
model is confidently wrong), for each ``lambda``. With ``--restarts``, a fourth: two double
sigmoid learners restarted from zero in turn, each every ``2K`` labels (offset by ``K``), the
older one deciding.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.datasets import load_dataset, resolve_dataset_path  # noqa: E402
from service.learning.losses import double_sigmoid_gradient  # noqa: E402

COST = 0.25
CHOW = math.log((1 - COST) / COST)


def standardised(X: np.ndarray) -> np.ndarray:
    """Each row standardised by the mean and std of the rows up to it, plus an intercept."""
    n = np.arange(1, X.shape[0] + 1)[:, None]
    mean = np.cumsum(X, axis=0) / n
    std = np.sqrt(np.maximum(np.cumsum(X * X, axis=0) / n - mean * mean, 0.0))
    z = np.where(std > 1e-9, (X - mean) / np.where(std > 1e-9, std, 1.0), X - mean)
    return np.hstack([z, np.ones((X.shape[0], 1))])


def run(
    X: np.ndarray,
    y: np.ndarray,
    eta: float,
    loss: str,
    free_rho: bool,
    radius: float | None = None,
    tail: float = 0.0,
) -> tuple[float, ...]:
    w, rho = np.zeros(X.shape[1]), 1.0 if free_rho else CHOW
    total = rejected = 0.0
    scores = []
    for t in range(X.shape[0]):
        x, yt = X[t], float(y[t])
        f = float(w @ x)
        z = yt * f
        if t % 50 == 0:
            scores.append(abs(f))
        if abs(f) <= rho:
            total, rejected = total + COST, rejected + 1
        elif z < 0:
            total += 1.0
        if loss == "logistic":
            g, g_rho = -1.0 / (1.0 + math.exp(min(z, 700.0))), 0.0
        else:
            g, g_rho = double_sigmoid_gradient(z, rho, COST, 1.0)
            g -= tail / (1.0 + math.exp(min(z, 700.0)))
        w = w - eta * g * yt * x
        if free_rho:
            rho = max(0.0, rho - eta * g_rho)
        if radius is not None and (norm := float(np.linalg.norm(w))) > radius:
            w, rho = w * (radius / norm), rho * (radius / norm)
    n = X.shape[0]
    return total / n, rejected / n, statistics.median(scores)


def restarted(X: np.ndarray, y: np.ndarray, eta: float, k: int) -> tuple[float, float]:
    """Two double sigmoid learners restarted in turn every ``2k`` labels; the older decides."""
    ws, rhos, ages = [np.zeros(X.shape[1]), np.zeros(X.shape[1])], [1.0, 1.0], [0, -k]
    total = rejected = 0.0
    for t in range(X.shape[0]):
        x, yt = X[t], float(y[t])
        i = 0 if ages[0] >= ages[1] else 1
        f = float(ws[i] @ x)
        if abs(f) <= rhos[i]:
            total, rejected = total + COST, rejected + 1
        elif yt * f < 0:
            total += 1.0
        for j in (0, 1):
            if ages[j] >= 0:
                g, g_rho = double_sigmoid_gradient(yt * float(ws[j] @ x), rhos[j], COST, 1.0)
                ws[j] = ws[j] - eta * g * yt * x
                rhos[j] = max(0.0, rhos[j] - eta * g_rho)
            ages[j] += 1
            if ages[j] >= 2 * k:
                ws[j], rhos[j], ages[j] = np.zeros(X.shape[1]), 1.0, 0
    n = X.shape[0]
    return total / n, rejected / n


def table(
    steps: list[float], heads: list[str], cell: Callable[[float, int], tuple[float, ...]]
) -> None:
    """One markdown table: a row per step, a column per head; ``cell(eta, column)`` gives
    (risk, share rejected[, median abs(f)])."""
    print("| step | " + " | ".join(heads) + " |")
    print("|---|" + "---|" * len(heads))
    for eta in steps:
        cells = []
        for c in range(len(heads)):
            risk, rejected, *scale = cell(eta, c)
            extra = f", median abs(f) {scale[0]:.1f}" if scale else ""
            cells.append(f"{risk:.4f} ({rejected:.0%} rejected{extra})")
        print(f"| {eta:g} | " + " | ".join(cells) + " |", flush=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument(
        "--steps", type=lambda t: [float(v) for v in t.split(",")], default=[0.1, 0.3, 1.0, 3.0]
    )
    p.add_argument("--radii", type=lambda t: [float(v) for v in t.split(",")], default=[])
    p.add_argument("--tails", type=lambda t: [float(v) for v in t.split(",")], default=[])
    p.add_argument("--restarts", type=lambda t: [int(v) for v in t.split(",")], default=[])
    args = p.parse_args(argv)
    X, y = load_dataset(resolve_dataset_path("elec2/elec.csv"))
    Z = standardised(X)
    losses = (("ds", True), ("ds", False), ("logistic", False))
    heads = ["double sigmoid, rho learnt", "double sigmoid, rho = ln 3", "logistic, rho = ln 3"]
    table(args.steps, heads, lambda eta, c: run(Z, y, eta, *losses[c]))
    if args.radii:
        print()
        heads = [f"double sigmoid, norm of w <= {r:g}" for r in args.radii]
        table(args.steps, heads, lambda eta, c: run(Z, y, eta, "ds", True, radius=args.radii[c]))
    if args.tails:
        print()
        heads = [f"double sigmoid + {t:g} x logistic, rho learnt" for t in args.tails]
        table(args.steps, heads, lambda eta, c: run(Z, y, eta, "ds", True, tail=args.tails[c]))
    if args.restarts:
        print()
        heads = [f"double sigmoid restarted every {k:,} labels" for k in args.restarts]
        table(args.steps, heads, lambda eta, c: restarted(Z, y, eta, args.restarts[c]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
