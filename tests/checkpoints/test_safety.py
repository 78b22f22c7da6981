"""No code from a checkpoint ever runs: pickles beyond tensors are refused with a clear error."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

from vitkit.checkpoints import read


class _Touch:
    """Unpickling this creates a file (a harmless stand-in for arbitrary code)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


class _Shell:
    """Unpickling this runs a shell command that creates a file."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize("payload", [_Touch, _Shell])
def test_malicious_pth_is_refused_and_nothing_runs(tmp_path, payload):
    marker = tmp_path / "pwned"
    raw = tmp_path / "raw.pth"  # a legacy (non-zip) pickle file
    raw.write_bytes(pickle.dumps({"state_dict": {"w": payload(marker)}}, protocol=2))
    zipped = tmp_path / "zipped.bin"  # torch.save's zip container
    torch.save({"w": torch.zeros(1), "evil": payload(marker)}, zipped)
    for path in (raw, zipped):
        with pytest.raises(ValueError, match="refusing to load.*pickled Python objects"):
            read(path)
    assert not marker.exists()
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(payload(control)))  # the payload is real: a plain unpickler does run it
    assert control.exists()


def test_pickled_object_npz_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.npz"
    objects = np.empty(1, dtype=object)
    objects[0] = _Shell(marker)
    np.savez(path, **{"embedding/kernel": objects})
    with pytest.raises(ValueError, match="pickled Python objects; refusing"):
        read(path)
    assert not marker.exists()


def test_random_bytes_are_refused_without_torchs_advice_to_unpickle(tmp_path):
    """torch's weights-only error advises weights_only=False or an allowlist: a vitkit user must never follow it."""
    path = tmp_path / "random.bin"
    path.write_bytes(bytes(range(3, 256)) * 16)  # opcode 3 first: the weights-only unpickler stops at once
    with pytest.raises(ValueError) as refused:
        read(path)
    assert str(refused.value) == (
        f"refusing to load {path}: it is not a checkpoint vitkit can read safely (not safetensors, not .npz, not "
        "a torch file of tensors only): it is damaged or holds pickled Python objects, and unpickling those could "
        "run code (the weights-only unpickler stopped at: Unsupported operand 3)"
    )


def test_a_refused_pickle_names_the_object_and_not_torchs_advice(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.bin"
    torch.save({"w": torch.zeros(1), "evil": _Shell(marker)}, path)
    with pytest.raises(ValueError) as refused:
        read(path)
    message = str(refused.value)
    assert message.startswith(f"refusing to load {path}: it is not a checkpoint vitkit can read safely")
    assert "(the weights-only unpickler stopped at: " in message and "GLOBAL posix.system" in message
    assert "weights_only" not in message and "safe_globals" not in message and not marker.exists()


def test_a_legacy_pickle_is_refused_in_one_line_without_torchs_warning(tmp_path):
    """A legacy (non-zip) torch file of pickle protocol 4 is refused; torch's two-line UserWarning about the
    protocol came before vitkit's one-line refusal."""
    import warnings

    path = tmp_path / "legacy.pth"
    torch.save({"w": torch.zeros(2)}, path, _use_new_zipfile_serialization=False, pickle_protocol=4)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(ValueError, match="refusing to load"):
        warnings.simplefilter("always")
        read(path)
    assert [str(w.message) for w in caught] == []
