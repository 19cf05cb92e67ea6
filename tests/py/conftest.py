"""Fixtures shared by the pytest files that drive the flashattn binary."""
import numpy as np
import pytest


@pytest.fixture
def qkv_dir(tmp_path):
    """A valid forward problem [1, 2, 8, 4] fp32 (Q, K, V as .npy) in tmp_path/data."""
    d = tmp_path / "data"
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in ("Q", "K", "V"):
        np.save(d / f"{name}.npy", rng.standard_normal((1, 2, 8, 4)).astype(np.float32))
    return d
