"""Local-file loaders (CIFAR-10 .npy.xz, FEMNIST .npz, Shakespeare HDF5) on fixture files the tests
write, the decoded-array cache, clear missing-file errors, and the real files when present."""

import os

import numpy as np
import pytest

from fedjax_dp.data import array_cache
from fedjax_dp.data.cifar_files import load_cifar10, load_cifar_uint8
from fedjax_dp.data.femnist_files import load_femnist
from fedjax_dp.data.shakespeare_files import (
    BOS_ID,
    CHAR_VOCAB,
    EOS_ID,
    OOV_ID,
    PAD_ID,
    decode,
    load_shakespeare,
    read_snippets,
    snippet_windows,
)
from fixture_files import (
    make_cifar_dir,
    make_femnist_file,
    make_shakespeare_dir,
    make_tff_emnist_dir,
    write_npy_xz,
)


def test_cifar_fixture_round_trip_and_cache(tmp_path):
    make_cifar_dir(tmp_path)
    cache = tmp_path / "cache"
    x, y, xt, yt = load_cifar10(str(tmp_path), str(cache))
    assert x.shape == (20, 32, 32, 3) and x.dtype == np.float32 and 0 <= x.min() and x.max() <= 1
    assert yt.tolist() == list(range(10)) and len(os.listdir(cache)) == 1
    load_cifar_uint8.cache_clear()
    calls = []
    cached = array_cache.cached_arrays(
        "cifar10",
        [str(tmp_path / f) for f in sorted(os.listdir(tmp_path)) if "xz" in f],
        lambda: calls.append(1),
        str(cache),
    )
    assert not calls, "the second load must come from the cache"
    assert set(cached) == {"x_train", "y_train", "x_test", "y_test"}


def test_cifar100_loads_100_classes_and_refuses_labels_out_of_range(tmp_path):
    """Issue 17 item 6: CIFAR-100 (fine labels) from the same file format; a label >= 100 is
    refused, and a CIFAR-10 directory with labels >= 10 too (the loader checks the class count it
    was asked for)."""
    make_cifar_dir(tmp_path)
    write_npy_xz(tmp_path / "y_train.npy.xz", (np.arange(20) * 5).astype(np.uint8))
    x, y, xt, yt = load_cifar10(str(tmp_path), "", "cifar100")
    assert x.shape == (20, 32, 32, 3) and y.max() == 95
    with pytest.raises(ValueError, match=r"CIFAR-10 train: labels must lie in \[0, 10\), found 95"):
        load_cifar10(str(tmp_path), "", "cifar10")


def test_cache_is_invalidated_when_a_source_changes(tmp_path):
    src = tmp_path / "a.bin"
    src.write_bytes(b"1")
    build = lambda v: lambda: {"v": np.array([v])}  # noqa: E731
    assert array_cache.cached_arrays("t", [str(src)], build(1), str(tmp_path / "c"))["v"][0] == 1
    assert array_cache.cached_arrays("t", [str(src)], build(2), str(tmp_path / "c"))["v"][0] == 1
    src.write_bytes(b"22")
    assert array_cache.cached_arrays("t", [str(src)], build(3), str(tmp_path / "c"))["v"][0] == 3


def test_cifar_bad_shape_is_rejected(tmp_path):
    make_cifar_dir(tmp_path)
    write_npy_xz(tmp_path / "x_test.npy.xz", np.zeros((10, 28, 28, 3), np.uint8))
    with pytest.raises(ValueError, match=r"CIFAR-10 test: expected x \(N, 32, 32, 3\)"):
        load_cifar10(str(tmp_path), "")


@pytest.mark.parametrize(
    "loader,name",
    [
        (lambda d: load_cifar10(d, ""), "x_train.npy.xz"),
        (load_femnist, "femnist_leaf_sf005_uint8.npz"),
        (lambda d: load_shakespeare(d, cache_dir=""), "shakespeare_train.h5"),
    ],
)
def test_missing_files_say_which_where_and_how(tmp_path, loader, name):
    with pytest.raises(
        FileNotFoundError, match=f"{name} not found in .*{tmp_path.name}.*data.data_dir.*TFDS"
    ):
        loader(str(tmp_path))


def test_femnist_groups_by_writer(tmp_path):
    arrays = make_femnist_file(tmp_path)
    train, test = load_femnist(str(tmp_path))
    assert train.x.shape == (12, 28, 28, 1) and test.client_ids().tolist() == ["w0", "w1", "w9"]
    by_writer = train.indices_by_client()
    np.testing.assert_array_equal(train.y[by_writer["w1"]], arrays["y_train"][4:8])
    inverted, _ = load_femnist(str(tmp_path), invert=True)
    np.testing.assert_allclose(inverted.x, 1.0 - train.x)


def test_femnist_reads_tensorflow_federateds_emnist_files_by_writer(tmp_path):
    arrays = make_tff_emnist_dir(tmp_path)
    train, test = load_femnist(str(tmp_path))
    assert train.x.shape == (6, 28, 28, 1) and test.client_ids().tolist() == [
        "f0000_14",
        "f0001_41",
    ]
    rows = train.indices_by_client()["f0001_41"]
    pixels, labels = arrays[("train", "f0001_41")]
    np.testing.assert_array_equal(train.y[rows], labels)
    np.testing.assert_allclose(train.x[rows][..., 0], pixels)
    inverted, _ = load_femnist(str(tmp_path), invert=True)
    np.testing.assert_allclose(inverted.x, 1.0 - train.x)


def test_femnist_reads_the_digits_only_files_and_needs_their_test_split(tmp_path):
    make_tff_emnist_dir(tmp_path, prefix="fed_emnist_digitsonly")
    assert load_femnist(str(tmp_path))[0].x.shape == (6, 28, 28, 1)
    (tmp_path / "fed_emnist_digitsonly_test.h5").unlink()
    load_femnist.cache_clear()
    with pytest.raises(FileNotFoundError, match="fed_emnist_digitsonly_test.h5 not found"):
        load_femnist(str(tmp_path))


def test_shakespeare_tokenisation_matches_tff_convention():
    x, y = snippet_windows(b"ab\xff", sequence_length=80)
    ids = [CHAR_VOCAB.index("a") + 1, CHAR_VOCAB.index("b") + 1, OOV_ID]
    expected = np.array([BOS_ID, *ids, EOS_ID] + [PAD_ID] * 76)
    np.testing.assert_array_equal(x[0], expected[:80])
    np.testing.assert_array_equal(y[0], expected[1:81])
    long = ("x" * 200).encode()
    x, y = snippet_windows(long, 80)
    assert x.shape == (3, 80)  # 202 tokens -> 3 windows of 81
    np.testing.assert_array_equal(x[0, 1:], y[0, :-1])  # targets are the inputs shifted by one
    assert decode(x[1]) == "x" * 80


def test_shakespeare_fixture_by_role(tmp_path):
    make_shakespeare_dir(
        tmp_path,
        {"KING": ["To be.", "Or not" * 30], "FOOL": ["Ha!"]},
        {"KING": ["Yes."], "FOOL": []},
    )
    assert read_snippets(str(tmp_path / "shakespeare_train.h5"))["KING"][0] == b"To be."
    train, test = load_shakespeare(str(tmp_path), cache_dir=str(tmp_path / "cache"))
    counts = {k: len(v) for k, v in train.indices_by_client().items()}
    assert counts == {"FOOL": 1, "KING": 1 + 3}  # 182 tokens -> 3 windows
    assert test.client_ids().tolist() == ["KING"]


def test_real_files_have_the_documented_sizes(shared_data_dir):
    x, y, xt, yt = load_cifar10(os.path.join(shared_data_dir, "cifar10"))
    assert x.shape == (50000, 32, 32, 3) and xt.shape == (10000, 32, 32, 3)
    assert np.bincount(y).tolist() == [5000] * 10 and np.bincount(yt).tolist() == [1000] * 10
    train, test = load_femnist(os.path.join(shared_data_dir, "femnist"))
    assert (len(train.y), len(test.y)) == (14708, 4088)
    assert len(set(train.client_ids()) & set(test.client_ids())) == 105
    for split, n in (("train", 16068), ("test", 2356)):
        snippets = read_snippets(
            os.path.join(shared_data_dir, "shakespeare", f"shakespeare_{split}.h5")
        )
        assert len(snippets) == 715 and sum(map(len, snippets.values())) == n


def test_the_default_data_folder_is_the_variable_or_a_per_user_folder_never_this_repositorys_layout(
    monkeypatch,
):
    """Issue 74, item 18: configs defaulted to ../shared/data/<dataset> relative to where one ran,
    and the error said so; a user's machine has no such folder."""
    from fedjax_dp.data.local_files import default_data_dir, find_file

    monkeypatch.setenv("FEDJAX_DP_DATA", "/data/root")
    assert default_data_dir("mnist") == "/data/root/mnist"
    monkeypatch.delenv("FEDJAX_DP_DATA")
    assert default_data_dir("mnist") == os.path.join(
        os.path.expanduser("~"), ".cache", "fedjax_dp", "data", "mnist"
    )
    with pytest.raises(FileNotFoundError) as missing:
        find_file(default_data_dir("mnist"), ("train-images-idx3-ubyte",), "mnist")
    message = str(missing.value)
    assert "FEDJAX_DP_DATA is not set" in message and ".cache/fedjax_dp/data/mnist" in message
    assert "set FEDJAX_DP_DATA to the folder that holds one folder per dataset" in message
    assert "shared" not in message
