"""Every notebook in notebooks/ runs from top to bottom without an error, and every cell tagged
"plot" draws an image."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))

# how many cells of each notebook are tagged "plot" (so that a lost tag cannot hide a lost plot)
PLOT_CELLS = {"quickstart.ipynb": 1, "analysis.ipynb": 5}


def test_there_are_notebooks() -> None:
    assert NOTEBOOKS, "notebooks/ holds no .ipynb file"


@pytest.mark.slow  # a Jupyter kernel per notebook, each building a store: 5-6 s apiece
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    notebook = nbformat.read(path, as_version=4)
    # Altair charts as PNG images (vl-convert), which the kernel inherits from this environment;
    # in Jupyter they are interactive and need a browser to draw
    monkeypatch.setenv("ENGAGELAKE_CHART_RENDERER", "png")
    # kernel "python3" is ipykernel in this interpreter (the uv environment), not a system kernel
    client = NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=600,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    errors = [
        output
        for cell in code
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]
    assert not errors
    plots = [cell for cell in code if "plot" in cell.metadata.get("tags", [])]
    assert len(plots) == PLOT_CELLS.get(path.name, 0)
    without_image = [
        cell.source.splitlines()[0]
        for cell in plots
        if not any("image/png" in output.get("data", {}) for output in cell.get("outputs", []))
    ]
    assert not without_image, f"plot cells that drew no PNG: {without_image}"
