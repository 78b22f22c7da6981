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
