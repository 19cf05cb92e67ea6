"""Output paths that collide with inputs or are special files (src/io_guard.h). Every input is
known by its identity (device, inode) once read, so no spelling of its path lets an output
replace it; device nodes, FIFOs and descriptor names are written in place, never replaced; a
preset that is a FIFO or a directory, or JSON nested without end, fails fast. All on the cpu
kernel (no GPU needed).
"""
import hashlib
import os
import stat
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

BUILD = os.environ.get("FLASHATTN_BUILD_DIR", "")
FLASHATTN = Path(BUILD) / "flashattn"

pytestmark = pytest.mark.skipif(
    not (BUILD and FLASHATTN.exists()), reason="set FLASHATTN_BUILD_DIR to a build with flashattn"
)

INPUT = 2


def digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run(*args, timeout=60, **kw):
    return subprocess.run([str(FLASHATTN), *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw)


def one_line_error(r, *needles):
    assert r.returncode == INPUT, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.mark.parametrize("spelling", ["direct", "dot-dot", "symlink", "hardlink"])
def test_json_naming_an_input_is_refused_and_the_input_kept(tmp_path, spelling, qkv_dir):
    d = qkv_dir
    before = digest(d / "K.npy")
    target = {
        "direct": d / "K.npy",
        "dot-dot": tmp_path / "data" / ".." / "data" / "K.npy",
        "symlink": tmp_path / "link.npy",
        "hardlink": tmp_path / "hard.npy",
    }[spelling]
    if spelling == "symlink":
        target.symlink_to(d / "K.npy")
    if spelling == "hardlink":
        os.link(d / "K.npy", target)
    r = run("--compute", "cpu", "--data", d, "--json", target, "-q")
    one_line_error(r, "--json", "inputs")
    assert digest(d / "K.npy") == before


def test_out_naming_the_data_dir_through_a_symlink_is_refused(tmp_path, qkv_dir):
    d = qkv_dir
    (tmp_path / "alias").symlink_to(d, target_is_directory=True)
    r = run("--compute", "cpu", "--data", d, "--out", tmp_path / "alias", "-q")
    one_line_error(r, "--out", "input directory")
    assert sorted(p.name for p in d.iterdir()) == ["K.npy", "Q.npy", "V.npy"]


def test_sweep_json_naming_the_preset_is_refused(tmp_path):
    preset = tmp_path / "p.json"
    preset.write_text('{"points": [{"B": 1, "H": 1, "S": 8, "D": 8, "dtype": "fp32"}]}')
    before = digest(preset)
    for spelling in (preset, tmp_path / "." / "p.json"):
        r = run("--sweep", preset, "--compute", "cpu", "--json", spelling, "-q")
        one_line_error(r, "--json", "inputs")
        assert digest(preset) == before


def test_json_to_a_fifo_is_written_in_place(tmp_path, qkv_dir):
    d = qkv_dir
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got = {}

    def reader():
        with open(fifo, "rb") as f:
            got["bytes"] = f.read()

    t = threading.Thread(target=reader)
    t.start()
    r = run("--compute", "cpu", "--data", d, "--json", fifo, "-q")
    t.join(timeout=30)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode), "the FIFO was replaced"
    assert b'"command_line"' in got.get("bytes", b"")


def test_json_to_dev_null_leaves_dev_null_a_device(tmp_path, qkv_dir):
    d = qkv_dir
    r = run("--compute", "cpu", "--data", d, "--json", "/dev/null", "-q")
    assert r.returncode == 0, r.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_json_to_dev_stdout_redirected_to_a_file_keeps_what_was_printed(tmp_path, qkv_dir):
    d = qkv_dir
    out = tmp_path / "stdout.txt"
    with open(out, "w") as f:
        r = subprocess.run([str(FLASHATTN), "--compute", "cpu", "--data", str(d), "--json", "/dev/stdout", "-q"],
                           stdout=f, stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert text.startswith("kernel"), text[:80]  # the table printed first is still there
    assert '"command_line"' in text


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_preset_that_is_not_a_regular_file_fails_fast(tmp_path, kind):
    p = tmp_path / "preset.json"
    if kind == "fifo":
        os.mkfifo(p)
    else:
        p.mkdir()
    r = run("--sweep", p, "--compute", "cpu", "-q", timeout=20)
    one_line_error(r, str(p))


def test_a_preset_nested_without_end_fails_fast(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text('{"points": ' + "[" * 200000 + "]" * 200000 + "}")
    r = run("--sweep", p, "--compute", "cpu", "-q", timeout=20)
    one_line_error(r, str(p), "nested deeper")


def test_meta_json_with_a_key_twice_is_refused(tmp_path):
    d = tmp_path / "bin"
    d.mkdir()
    rng = np.random.default_rng(0)
    for name in ("Q", "K", "V"):
        rng.standard_normal((1, 2, 8, 4)).astype(np.float32).tofile(d / f"{name}.bin")
    (d / "meta.json").write_text('{"B": 1, "H": 2, "S": 8, "D": 4, "D": 4, "dtype": "fp32"}')
    r = run("--compute", "cpu", "--data", d, "--no-write", "-q")
    one_line_error(r, "meta.json", "appears twice")


def test_a_directory_where_an_output_file_goes_is_refused_before_the_run(tmp_path, qkv_dir):
    d = qkv_dir
    out = tmp_path / "out"
    (out / "lse.npy").mkdir(parents=True)
    r = run("--compute", "cpu", "--data", d, "--out", out, "-q")
    one_line_error(r, "--out", "lse.npy is a directory")
    assert sorted(p.name for p in out.iterdir()) == ["lse.npy"]
