#!/usr/bin/env python3
"""Writes the seed corpus of flashattn_fuzz (tests/fuzz/corpus/): small valid and invalid .npy
files of every version and dtype, meta.json variants and directory names. The files are committed;
run this again only to change the seeds (it rewrites the directory).

    python3 tests/fuzz/make_corpus.py
"""
import io
import json
import shutil
import struct
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent / "corpus"


def npy_bytes(a, version=None):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, a)
    else:
        np.lib.format.write_array(buf, a, version=version)
    return buf.getvalue()


def raw_npy(header, data=b"", version=1, magic=b"\x93NUMPY"):
    """A .npy file with a hand-written header dict (str) and data bytes."""
    h = header.encode("utf-8") if isinstance(header, str) else header
    if version == 1:
        prefix = magic + bytes([1, 0]) + struct.pack("<H", len(h))
    else:
        prefix = magic + bytes([version, 0]) + struct.pack("<I", len(h))
    return prefix + h + data


def main():
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir()
    seeds = {}
    rng = np.random.default_rng(0)

    # Valid arrays: every accepted dtype, ranks 0 to 4, each header version.
    for dt in ["<f2", "<f4", "<f8", "<i4", "<i8"]:
        seeds[f"valid_{dt[1:]}_4d.npy"] = npy_bytes((rng.standard_normal((1, 2, 3, 2)) * 3).astype(dt))
    bf16 = np.arange(6, dtype=np.uint16).view("V2").reshape(2, 3)  # what ml_dtypes' bfloat16 saves as
    seeds["valid_bf16_V2.npy"] = npy_bytes(bf16)
    seeds["valid_scalar.npy"] = npy_bytes(np.float32(1.5))
    seeds["valid_1d.npy"] = npy_bytes(np.arange(4, dtype=np.int32))
    seeds["valid_empty_dim.npy"] = npy_bytes(np.zeros((2, 0, 3), np.float32))
    seeds["valid_v2.npy"] = npy_bytes(np.ones((2, 2), np.float32), version=(2, 0))
    seeds["valid_v3.npy"] = npy_bytes(np.ones((2, 2), np.float16), version=(3, 0))
    seeds["valid_mask_shared.npy"] = npy_bytes(np.where(rng.random((5, 7)) < 0.2, -np.inf, 0).astype(np.float32))
    seeds["valid_nonfinite.npy"] = npy_bytes(np.array([1, np.nan, np.inf, -np.inf], np.float32))
    seeds["valid_double_quotes_long.npy"] = raw_npy(
        '{"shape": (2L, 1L), "fortran_order": False, "descr": "<f4"}\n', b"\0" * 8)

    # Invalid .npy files, one problem each.
    good = npy_bytes(np.ones((2, 3), np.float32))
    seeds["bad_magic.npy"] = b"\x93NUMPX" + good[6:]
    seeds["bad_truncated_prefix.npy"] = good[:8]
    seeds["bad_truncated_header.npy"] = good[:40]
    seeds["bad_truncated_data.npy"] = good[:-4]
    seeds["bad_trailing_data.npy"] = good + b"\0" * 4
    seeds["bad_version_4.npy"] = good[:6] + bytes([4, 0]) + good[8:]
    seeds["bad_header_len_lies.npy"] = good[:8] + struct.pack("<H", 60000) + good[10:]
    seeds["bad_v2_len_lies.npy"] = raw_npy("{}", version=2)[:8] + struct.pack("<I", 0xFFFFFFF0)
    d = b"\0" * 24
    seeds["bad_big_endian.npy"] = raw_npy("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }\n", d)
    seeds["bad_fortran.npy"] = raw_npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }\n", d)
    seeds["bad_object.npy"] = raw_npy("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }\n", d[:16])
    seeds["bad_structured.npy"] = raw_npy(
        "{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, 'shape': (3,), }\n", d)
    seeds["bad_v3_utf8_field.npy"] = raw_npy(
        "{'descr': [('\u00e9t\u00e9', '<f4')], 'fortran_order': False, 'shape': (6,), }\n", d, version=3)
    seeds["bad_complex.npy"] = raw_npy("{'descr': '<c8', 'fortran_order': False, 'shape': (3,), }\n", d)
    seeds["bad_negative_dim.npy"] = raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }\n", d)
    seeds["bad_overflow_dim.npy"] = raw_npy(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999, 2), }\n", d)
    seeds["bad_absurd_product.npy"] = raw_npy(
        "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }\n", d)
    seeds["bad_huge_dim.npy"] = raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }\n", d)
    seeds["bad_missing_key.npy"] = raw_npy("{'descr': '<f4', 'shape': (6,), }\n", d)
    seeds["bad_extra_key.npy"] = raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': 1}\n", d)
    seeds["bad_duplicate_key.npy"] = raw_npy("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}\n", d)
    seeds["bad_unterminated.npy"] = raw_npy("{'descr': '<f4, 'fortran_order': False, 'shape': (6,), }\n", d)
    seeds["bad_escape.npy"] = raw_npy("{'descr': '<f\\x34', 'fortran_order': False, 'shape': (6,), }\n", d)
    seeds["bad_newline_in_descr.npy"] = raw_npy("{'descr': '<f\n4', 'fortran_order': False, 'shape': (6,), }\n", d)
    seeds["bad_nested.npy"] = raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': ((((((((((1,),),),),),),),),),), }\n", d)
    seeds["bad_shape_list.npy"] = raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': [6], }\n", d)
    seeds["bad_not_a_dict.npy"] = raw_npy("('<f4', False, (6,))\n", d)

    # meta.json variants (valid and invalid).
    metas = {
        "meta_full.json": {"format_version": 1, "layout": "bhsd", "dtype": "fp32", "B": 1, "H": 2, "H_kv": 1,
                           "S_q": 3, "S_k": 4, "D": 2,
                           "files": {"mask": {"dtype": "fp32", "shape": [3, 4]},
                                     "seqlens_k": {"dtype": "int64"}}},
        "meta_layout_only.json": {"layout": "bshd"},
        "meta_S.json": {"B": 1, "H": 1, "S": 2, "D": 3, "dtype": "bf16"},
        "meta_files_only.json": {"files": {n: {"dtype": "fp16", "shape": [1, 1, 2, 2]} for n in ["Q", "K", "V", "dO"]}},
        "meta_bad_version.json": {"format_version": 2, "B": 1},
        "meta_bad_layout.json": {"layout": "sbhd"},
        "meta_bad_types.json": {"B": "2", "H": 1.5, "S": -1, "D": True, "dtype": "int8"},
        "meta_bad_files.json": {"B": 1, "H": 1, "S": 1, "D": 1, "files": {"Q": {"shape": [1, -1]}, "K": 3}},
        "meta_huge.json": {"B": 9223372036854775807, "H": 9223372036854775807, "S": 2, "D": 2},
        "meta_unsigned_overflow.json": {"B": 18446744073709551615, "H": 1, "S": 1, "D": 1},
        "meta_missing_D.json": {"B": 1, "H": 1, "S": 1},
    }
    for name, m in metas.items():
        seeds[name] = json.dumps(m).encode()
    seeds["meta_not_object.json"] = b"[1, 2, 3]"
    seeds["meta_invalid.json"] = b'{"B": 1, "H": '
    seeds["meta_nested.json"] = b"[" * 200 + b"]" * 200
    seeds["meta_utf8.json"] = '{"layout": "bhsd", "note": "\u00e9\u4e2d"}'.encode()

    # Directory names (the first line of the input).
    for name in ["B1_H2_S3_D4", "B2_H8_S512_D64", "B01_H2_S3_D4", "B1_H2_S3", "B1_H2_S3_D4_x", "B9999999999_H1_S1_D1"]:
        seeds[f"dir_{name}.txt"] = (name + "\n").encode()

    total = 0
    for name, data in sorted(seeds.items()):
        (OUT / name).write_bytes(data)
        total += len(data)
    print(f"wrote {len(seeds)} seeds, {total} bytes, to {OUT}")


if __name__ == "__main__":
    main()
