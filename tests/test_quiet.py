"""One clear line, not library noise: the libraries' logs go to the workdir's ``library.log``, and
a damaged checkpoint's warning names the cause without TensorStore's spec dump."""

from __future__ import annotations

from absl import logging as absl_logging

import fedjax_dp
from fedjax_dp.training.callbacks import Callback
from fedjax_dp.training.checkpointing import _first_line


class LibraryNoise(Callback):
    """Logs as orbax does (absl, at ERROR: what a full disk gave by the hundred lines)."""

    def on_train_begin(self, run):
        absl_logging.error("orbax-like detail: Failed to json parse Metadata file")


def test_library_errors_go_to_the_workdirs_log_file_not_the_terminal(tmp_path, capfd):
    experiment = fedjax_dp.Experiment(
        "fedavg_mnist", {"rounds": 1, "model.name": "logistic", "sampling.cohort_size": 2}
    )
    experiment.run(str(tmp_path / "w"), progress=False, callbacks=[LibraryNoise()])
    out, err = capfd.readouterr()
    assert "orbax-like detail" not in out + err
    assert "orbax-like detail" in (tmp_path / "w" / "library.log").read_text()


def test_a_checkpoint_error_is_one_line_with_its_cause_and_no_tensorstore_spec():
    """The fallback warning cut TensorStore's message at 200 characters, before its cause, or
    printed the spec's escaped JSON."""
    spec = '{\\"driver\\":\\"zarr\\",\\"kvstore\\":{\\"path\\":\\"/w/state/\\"}}'
    error = ValueError(
        'OUT_OF_RANGE: Error opening "cast" driver: Error opening "zarr" driver: Error reading'
        ' "state.round/.zarray" in OCDBT database at local file "/w/checkpoints/round_000002/'
        'state/": Error reading Byte range [0, 2062) of local file "/w/checkpoints/round_000002/'
        'state/d/18556b4d107eeac9c8c8c4f9c0af5981": Requested byte range [0, 2062) is not valid'
        f" for value of size 100 [tensorstore_spec='{spec}'] [tensorstore_spec[1]='{spec}']"
    )
    line = _first_line(error)
    assert line.startswith("ValueError: OUT_OF_RANGE: Error opening")
    assert line.endswith("Requested byte range [0, 2062) is not valid for value of size 100")
    assert "tensorstore_spec" not in line and len(line) < 260
