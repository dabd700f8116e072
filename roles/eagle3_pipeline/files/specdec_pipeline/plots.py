"""The one plot writer of the reports: a PNG through matplotlib when the venv has it, else the caller's SVG.

    name = plots.figure(report_dir, "loss", lambda ax: ax.plot(xs, ys), {"title": ..., "xlabel": ..., "ylabel": ...})

Used by the pipeline's report (report.py), the evaluation section (report_evaluate.py) and the AL-per-vLLM plot
(evaluate_upgrade.py). The file is written atomically (fsutil.atomic_path).
"""

from pathlib import Path

from specdec_pipeline.fsutil import atomic_path


def _pyplot():
    """matplotlib's pyplot on the Agg backend (no display), or None when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: PLC0415 - only where a report is written

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return None
    return plt


def figure(dest_dir, stem, draw, labels, legend=False, svg=None):
    """DEST_DIR/STEM.png: DRAW(ax) on a 5 x 3 in figure whose axes get LABELS (ax.set: title, xlabel, ylabel, ylim,
    ...) and a legend when LEGEND. Without matplotlib: DEST_DIR/STEM.svg with the text SVG() returns, or nothing
    when SVG is None. Returns the file name written, or None."""
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    plt = _pyplot()
    if plt is None:
        if svg is None:
            return None
        with atomic_path(dest_dir / f"{stem}.svg") as tmp:
            tmp.write_text(svg())
        return f"{stem}.svg"
    fig, ax = plt.subplots(figsize=(5, 3))
    try:
        draw(ax)
        ax.set(**labels)
        if legend:
            ax.legend()
        fig.tight_layout()
        with atomic_path(dest_dir / f"{stem}.png") as tmp:
            fig.savefig(tmp, format="png")
    finally:
        plt.close(fig)
    return f"{stem}.png"
