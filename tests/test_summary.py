"""docs/SUMMARY.md is generated from the executed notebooks' `claims` cells, and is current."""

import importlib.util
import json
import pathlib
import sys

import workbench as wb

ROOT = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("summary", ROOT / "scripts" / "summary.py")
summary = sys.modules["summary"] = importlib.util.module_from_spec(spec)  # dataclasses look it up there
spec.loader.exec_module(summary)

# (claim, source, measured here, verdict, evidence): wb.claims keeps a verdict its evidence carries
ROWS = [("1.5-2.5x faster", "NVIDIA, *Train With Mixed Precision*", "fp16 0.10x  (emulated), bf16 2.97x",
         "does not hold here: fp16 emulated | bf16 native", wb.evidence.speed({"fp16": 0.10, "bf16": 2.97}, 1.5, free_core=True)),
        ("~50% less memory", "seed 003", "saved activations 0.67x, exact", "holds in part: LayerNorm stays fp32",
         wb.evidence.count()),
        ("the same gradients", "seed 000", "max relative difference 0.0e+00", "holds", wb.evidence.count())]


def _notebook(folder, name, output_text=None, tagged=True):
    cell = {"cell_type": "code", "metadata": {"tags": ["claims"] if tagged else []}, "execution_count": 1,
            "source": "wb.claims(...)", "outputs": []}
    if output_text is not None:
        cell["outputs"] = [{"output_type": "execute_result", "execution_count": 1, "metadata": {},
                            "data": {"text/plain": output_text.splitlines(keepends=True), "text/html": "<table/>"}}]
    path = folder / f"{name}.ipynb"
    path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_the_committed_summary_is_what_the_notebooks_give():
    assert (ROOT / "docs" / "SUMMARY.md").read_text() == summary.render(ROOT), \
        "docs/SUMMARY.md is stale: run `python scripts/summary.py` and commit it"


def test_the_table_wb_claims_prints_is_read_back_cell_for_cell(tmp_path):
    table = wb.claims("01_mixed_precision", "cpu", ROWS)
    for text in (str(table), repr(table), "some log line\n" + str(table) + "\n\nafter"):
        found = summary.claims_of(_notebook(tmp_path, "01_x", text))
        assert (found.notebook, found.device) == ("01_mixed_precision", "cpu")
        assert found.rows == table.checked  # double spaces and "|" inside a cell survive


def test_a_notebook_without_a_claims_table_gets_a_line_saying_so(tmp_path):
    assert summary.claims_of(_notebook(tmp_path, "a", None, tagged=False)) == "no cell tagged `claims`"
    assert "no saved claims table" in summary.claims_of(_notebook(tmp_path, "b", None))
    assert "no saved claims table" in summary.claims_of(_notebook(tmp_path, "c", "42"))
    garbled = summary.claims_of(_notebook(tmp_path, "d", "Claims checked: 01 on cpu\nsomething else"))
    assert garbled.startswith("its claims table could not be read (not a claims header")


def test_the_page_holds_both_machines_tables_and_counts_the_verdicts(tmp_path):
    (tmp_path / "notebooks").mkdir()
    gpu = tmp_path / "docs" / "gpu-reference" / "run2" / "notebooks"
    gpu.mkdir(parents=True)
    (tmp_path / "docs" / "gpu-reference" / "run10" / "notebooks").mkdir(parents=True)
    _notebook(tmp_path / "notebooks", "01_mixed_precision", str(wb.claims("01_mixed_precision", "cpu", ROWS)))
    _notebook(tmp_path / "notebooks", "02_gradient_accumulation", None, tagged=False)
    _notebook(gpu, "01_mixed_precision", str(wb.claims("01_mixed_precision", "cuda", ROWS[:1])))
    _notebook(tmp_path / "docs" / "gpu-reference" / "run10" / "notebooks", "01_mixed_precision",
              str(wb.claims("01_mixed_precision", "cuda", ROWS[2:])))  # run10 is later than run2
    page = summary.render(tmp_path)
    assert "| here | 1 | 1 | 1 | 0 |" in page and "| GPU reference | 1 | 0 | 0 | 0 |" in page
    assert "| 1.5-2.5x faster | NVIDIA, *Train With Mixed Precision* | fp16 0.10x  (emulated), bf16 2.97x | " \
           "does not hold here: fp16 emulated \\| bf16 native (a free core) |" in page
    assert "(`docs/gpu-reference/run10/notebooks/01_mixed_precision.ipynb`, 01_mixed_precision on cuda)" in page
    assert "**Here** (`notebooks/02_gradient_accumulation.ipynb`): no cell tagged `claims`." in page
    assert "**GPU reference**: not run on the GPU reference yet." in page


def test_a_gpu_run_without_claims_cells_lists_what_it_recorded_and_no_verdicts(tmp_path):
    """The GPU reference predates the claims cells: its summary.json's figures, as recorded, no made-up verdicts."""
    (tmp_path / "notebooks").mkdir()
    _notebook(tmp_path / "notebooks", "01_mixed_precision", str(wb.claims("01_mixed_precision", "cpu", ROWS)))
    run = tmp_path / "docs" / "gpu-reference" / "run1"
    (run / "notebooks").mkdir(parents=True)
    _notebook(run / "notebooks", "01_mixed_precision", None, tagged=False)  # an old notebook: no claims cell
    fp32 = {"name": "fp32", "precision": "fp32", "batch_size": 32, "grad_accum_steps": 1, "steps": 30,
            "step_time_s": 0.2395, "samples_per_sec": 133.6, "peak_bytes": 16346823168, "mfu": 0.5793}
    (run / "summary.json").write_text(json.dumps({
        "machine": {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130"},
        "notebooks": {"01_mixed_precision": {"status": "ok", "error": None, "seconds": 29.6, "skipped": [],
                                             "claims": {"runs": [fp32, fp32], "fp16_speedup_vs_fp32": 3.6371}}}}))
    page = summary.render(tmp_path)
    assert "| GPU reference |" not in page and "No verdicts from a GPU yet" in page
    assert ("**GPU reference, recorded** (`docs/gpu-reference/run1/summary.json`, NVIDIA H200, torch 2.11.0+cu130; "
            "no claims cell in that run, so no verdicts): ok, 29.6 s.") in page
    assert "| fp32 | fp32 | 32 x 1 | 30 | 239.5 | 134 | 15.22 | 0.579 |" in page  # once: runs are listed by name
    assert page.count("| fp32 | fp32 |") == 1 and "`fp16_speedup_vs_fp32` 3.637" in page
