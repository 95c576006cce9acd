"""``experiments/grids/gpu_grid.py``: the GPU grid's cells, their commands (resumable, pointed at
the data) and the raw rows a finished cell writes; nothing is trained here."""

import json
import os
import sys

import pytest

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "experiments", "grids")
)

import gpu_grid  # noqa: E402


def test_every_cell_is_named_once_resumes_and_reads_the_data_root():
    names = [c.name for c in gpu_grid.CELLS]
    assert len(names) == len(set(names)) == 90
    for cell in gpu_grid.CELLS:
        cmd = gpu_grid.command(cell, "/o", "/data")
        assert (
            cmd[-1] in ("--resume", "--reuse") and cmd[cmd.index("--out") + 1] == f"/o/{cell.name}"
        )
        if cell.script == "seed004_tables.py":
            assert cmd[cmd.index("--data-dir") + 1] == "/data/cifar10" and "300" in cmd
    sweep = [
        c for c in gpu_grid.CELLS if c.name.startswith("t2_paper_scale") and c.name.endswith("_s0")
    ]
    assert [c.argv[c.argv.index("--set") + 1] for c in sweep] == [
        "cuag.sigma_scale=1",
        "cuag.sigma_scale=0.5",
        "cuag.sigma_scale=0.25",
        "cuag.sigma_scale=0.125",
        "cuag.sigma_scale=0.0625",
    ]


def test_the_noise_sweep_and_larger_cnn_run_again_in_the_authors_pipeline():
    """Issue 92 item 7: the headline Table 2 rows were measured in the authors' pipeline with
    augmentation, so the cells that ask questions of them must run there too."""
    authors = {c.name for c in gpu_grid.CELLS if c.name.startswith("t2a_")}
    expected = {
        f"t2a_{name}_s{seed}"
        for name in [f"paper_scale{s:g}" for s in (1, 0.5, 0.25, 0.125, 0.0625)]
        + ["paper_sigma0.45", "pfldyn_authors_cnn", "paper_authors_cnn"]
        for seed in (0, 1, 2)
    }
    assert authors == expected
    for cell in gpu_grid.CELLS:
        sets = cell.argv[cell.argv.index("--set") + 1 :] if "--set" in cell.argv else ()
        in_pipeline = "data.augment=crop_flip" in sets and "data.normalize=channel" in sets
        assert in_pipeline == (cell.name in authors), cell.name
    from fedjax_dp.configs import cuag_pfl_cifar10

    authors_config, seeds_config = (
        cuag_pfl_cifar10.get_config("authors"),
        cuag_pfl_cifar10.get_config(),
    )
    # the pipeline is what ``:authors`` sets, plus augmentation
    for item in gpu_grid.AUTHORS_PIPELINE:
        key, value = item.split("=")
        section, field = key.split(".")
        want = getattr(getattr(authors_config, section), field)
        if key != "data.augment":
            assert str(want) == value and want != getattr(getattr(seeds_config, section), field)
    twin = next(c for c in gpu_grid.CELLS if c.name == "t2a_paper_scale0.25_s1")
    assert "cuag.sigma_scale=0.25" in twin.argv and twin.argv[twin.argv.index("--seed") + 1] == "1"


def test_a_finished_cell_writes_raw_rows_and_is_skipped_after(tmp_path, monkeypatch):
    run = tmp_path / "out" / "t2_sound_s0" / "acid3-x"
    run.mkdir(parents=True)
    (run / "config.json").write_text('{"seed": 0}')
    (run / "summary.json").write_text('{"rounds": 2}')
    (run / "metrics.jsonl").write_text('{"round": 1}\n{"round": 2}\n')
    calls = []
    monkeypatch.setattr(gpu_grid, "run_script", lambda cmd, env: calls.append(cmd) or 0)
    argv = [
        "--only",
        "t2_sound_s0",
        "--out",
        str(tmp_path / "out"),
        "--rows",
        str(tmp_path / "rows"),
        "--data-root",
        str(tmp_path),
    ]
    gpu_grid.main(argv)
    rows = json.load(open(tmp_path / "rows" / "t2_sound_s0.json"))
    assert (
        rows["runs"][0]["metrics"] == [{"round": 1}, {"round": 2}]
        and rows["setting"]["cell"] == "t2_sound_s0"
    )
    gpu_grid.main(argv)
    assert len(calls) == 1  # the second call found its raw rows and ran nothing


def test_an_unknown_cell_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        gpu_grid.main(["--only", "t9_nothing"])
    assert "t9_nothing" in capsys.readouterr().err
