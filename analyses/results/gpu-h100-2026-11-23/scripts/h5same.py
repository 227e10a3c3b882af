"""Byte-for-byte comparison of every dataset of two HDF5 files but /prompts (as tests/test_shards.py)."""
import sys
import h5py

def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out

a, b = datasets(sys.argv[1]), datasets(sys.argv[2])
bad = [n for n in a if not n.startswith("prompts/") and (n not in b or a[n].dtype != b[n].dtype or a[n].shape != b[n].shape
                                                         or a[n].tobytes() != b[n].tobytes())]
print(f"datasets compared: {sum(not n.startswith('prompts/') for n in a)}; keys equal: {a.keys() == b.keys()}; "
      f"differing: {bad or 'none'}")
