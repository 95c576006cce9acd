"""Shakespeare by speaking role from TensorFlow Federated's HDF5 files
(``shakespeare_{train,test}.h5``: ``examples/<role>/snippets``, one byte string per line spoken).

Tokenisation follows TFF's char-RNN benchmark (google-research/federated, ``shakespeare_dataset``;
sequence length 80 from McMahan et al. 2017): a snippet's bytes are looked up in the 86-character
vocabulary (ids 1..86; 0 is padding, 87 out-of-vocabulary, 88 beginning, 89 end of snippet),
wrapped as ``[BOS] + ids + [EOS]``, padded with 0 to a multiple of 81 and cut into 81-token
windows; each window gives an input ``w[:-1]`` and next-character targets ``w[1:]`` (80 each).
Targets equal to ``PAD_ID`` are padding and must be masked out of losses and accuracy.
"""

from __future__ import annotations

import functools

import numpy as np

from fedjax_dp.data.array_cache import cached_arrays
from fedjax_dp.data.file_integrity import read_checked
from fedjax_dp.data.local_files import find_file, open_hdf5
from fedjax_dp.data.natural_clients import GroupedSplit

CHAR_VOCAB = (
    "dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#'/37;?bfjnrvzBFJNRVZ\"&*.26:\naeimquyAEIMQUY]!%)-159\r"
)
PAD_ID, OOV_ID, BOS_ID, EOS_ID = 0, len(CHAR_VOCAB) + 1, len(CHAR_VOCAB) + 2, len(CHAR_VOCAB) + 3
VOCAB_SIZE = len(CHAR_VOCAB) + 4
SEQUENCE_LENGTH = 80

_BYTE_TO_ID = np.full(256, OOV_ID, dtype=np.int32)
_BYTE_TO_ID[[ord(c) for c in CHAR_VOCAB]] = np.arange(1, len(CHAR_VOCAB) + 1)


def snippet_windows(
    snippet: bytes, sequence_length: int = SEQUENCE_LENGTH
) -> tuple[np.ndarray, np.ndarray]:
    """One snippet -> ``(inputs, targets)``, each ``(num_windows, sequence_length)`` int32."""
    ids = _BYTE_TO_ID[np.frombuffer(snippet, dtype=np.uint8)]
    tokens = np.concatenate([[BOS_ID], ids, [EOS_ID]]).astype(np.int32)
    split = sequence_length + 1
    tokens = np.concatenate([tokens, np.full(-len(tokens) % split, PAD_ID, np.int32)]).reshape(
        -1, split
    )
    return tokens[:, :-1], tokens[:, 1:]


def decode(ids: np.ndarray) -> str:
    """Inverse of the lookup for display: special tokens become '', '?', '<', '>'."""
    table = ["", *CHAR_VOCAB, "?", "<", ">"]
    return "".join(table[i] for i in np.asarray(ids).ravel())


def read_snippets(path: str) -> dict[str, list[bytes]]:
    """``{role: [snippet bytes, ...]}`` of one TFF Shakespeare HDF5 file."""
    with open_hdf5(path, "data.source=shakespeare") as f:
        if "examples" not in f:
            raise ValueError(f"{path} is not a TFF Shakespeare file: it has no 'examples' group")
        return {
            role: [bytes(s) for s in f["examples"][role]["snippets"][()]] for role in f["examples"]
        }


def _read_split(path: str, sequence_length: int) -> dict[str, np.ndarray]:
    xs, ys, roles = [], [], []
    for role, snippets in read_snippets(path).items():
        for snippet in snippets:
            x, y = snippet_windows(snippet, sequence_length)
            xs.append(x)
            ys.append(y)
            roles += [role] * len(x)
    if not xs:
        raise ValueError(f"{path} holds no snippets")
    return {"x": np.concatenate(xs), "y": np.concatenate(ys), "client": np.array(roles)}


@functools.lru_cache(maxsize=2)
def load_shakespeare(
    data_dir: str, sequence_length: int = SEQUENCE_LENGTH, cache_dir: str | None = None
) -> tuple[GroupedSplit, GroupedSplit]:
    """Returns ``(train, test)`` token windows grouped by speaking role."""
    if sequence_length < 1:
        raise ValueError(f"sequence_length must be >= 1, got {sequence_length}")
    out = []
    for split in ("train", "test"):
        path = find_file(data_dir, (f"shakespeare_{split}.h5",), "Shakespeare")
        arrays = cached_arrays(
            f"shakespeare_{split}",
            [path],
            lambda: read_checked(path, "Shakespeare", lambda p: _read_split(p, sequence_length)),
            cache_dir,
            params={"sequence_length": sequence_length},
        )
        out.append(GroupedSplit(arrays["x"], arrays["y"], arrays["client"]))
    return out[0], out[1]
