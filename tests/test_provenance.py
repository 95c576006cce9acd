"""``experiments/provenance.py``: every raw row says how it was made (command, commit, date,
machine and the versions of the libraries its numbers depend on), and every experiment script that
writes a results file goes through it."""

import glob
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXPERIMENTS = os.path.join(HERE, "..", "experiments")
sys.path.insert(0, EXPERIMENTS)

import provenance  # noqa: E402

SUMMARIES = {
    # read committed raw rows and print or write a summary of them; they run nothing
    "seed003_alpha.py",
    "seed003_seeds.py",
}


def test_provenance_records_the_machine_and_every_library_version():
    p = provenance.provenance()
    assert {"command", "commit", "dirty", "date", "machine", "versions"} <= set(p)
    assert set(p["versions"]) == {"python", *provenance.LIBRARIES}
    assert set(provenance.LIBRARIES) == {
        "jax",
        "jaxlib",
        "flax",
        "optax",
        "dp-accounting",
        "jax-privacy",
        "numpy",
    }
    assert all(isinstance(v, str) and v for v in p["versions"].values())  # all installed here
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", p["date"])
    json.dumps(p)  # strict JSON


def test_a_missing_library_is_recorded_as_none():
    assert (
        provenance.library_versions(("no-such-distribution-xyz",))["no-such-distribution-xyz"]
        is None
    )


def test_stamped_and_write_provenance(tmp_path):
    record = provenance.stamped({"rows": [1]})
    assert list(record) == ["provenance", "rows"] and "versions" in record["provenance"]
    with open(provenance.write_provenance(str(tmp_path))) as f:
        assert "versions" in json.load(f)


def test_every_script_that_writes_a_results_file_goes_through_provenance():
    writes = re.compile(r"json\.dump\(|write_json\(|strict_json\(")
    unstamped = []
    for path in glob.glob(os.path.join(EXPERIMENTS, "**", "*.py"), recursive=True):
        name = os.path.basename(path)
        with open(path) as f:
            text = f.read()
        if name == "provenance.py" or name in SUMMARIES or not writes.search(text):
            continue
        if '"w")' not in text and "write_json(" not in text:
            continue  # prints only
        if not re.search(r"\b(provenance|stamped|write_provenance)\(", text):
            unstamped.append(name)
    assert unstamped == []
