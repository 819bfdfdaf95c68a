#!/usr/bin/python3
"""An mt checkpoint read with h5py alone, following the layout docs/DESIGN.md documents.

  ckpt_h5py.py check FILE       every tensor by name: float32 (or bfloat16/float16 after
                                mt-ckpt convert), its checksum recomputed here from
                                the format's definition (sum mod 2^64 of splitmix64(splitmix64(i)
                                ^ bits) over global row-major indices i) equals the stored one;
                                prints one JSON line: tensors, names of the first few, root state
  ckpt_h5py.py corrupt FILE HOW [NAME [INDEX]]
                                damages a copy for the refusal tests: value (one ulp of NAME),
                                delete (NAME), float64 (NAME), reshape (NAME, transposed),
                                version (mt_format_version 99), nan (element INDEX of NAME,
                                row-major, default 0, negative from the end; prints the index),
                                attribute (root attribute NAME set to the integer INDEX, its
                                type kept)
Used by tests/tools/mt-ckpt.bats, mt-train.bats and numerics.bats; needs Debian's python3-h5py and python3-numpy.
"""
import json
import sys

import h5py
import numpy as np

MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix64(x):
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def checksum(values):
    flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    index = np.arange(flat.size, dtype=np.uint64)
    bits = flat.view(np.uint32).astype(np.uint64)
    with np.errstate(over="ignore"):
        hashes = splitmix64(splitmix64(index) ^ bits)
    return int(np.sum(hashes, dtype=np.uint64))  # numpy wraps mod 2^64


def tensors(handle):
    names = []
    handle.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    return sorted(names)


def check(path):
    with h5py.File(path, "r") as f:
        if f.attrs["mt_format"] not in (b"mt-checkpoint", "mt-checkpoint"):
            raise SystemExit("%s: mt_format is %r" % (path, f.attrs["mt_format"]))
        names = tensors(f)
        for name in names:
            data = f[name]
            # mt-ckpt convert --dtype stores bfloat16 (h5py shows it as float32: HDF5 widens it
            # exactly) or float16; checksums are over the values as float32.
            if data.dtype not in (np.float32, np.float16):
                raise SystemExit("%s: %s is %s, not float32 or float16" % (path, name, data.dtype))
            stored = int(data.attrs["checksum"])
            computed = checksum(data[()])
            if stored != computed:
                raise SystemExit("%s: %s: stored checksum %016x, computed %016x" % (path, name, stored, computed))
        state = {key: (f.attrs[key].item() if hasattr(f.attrs[key], "item") else f.attrs[key])
                 for key in ("mt_format_version", "iteration", "consumed_train_samples", "seed")}
        model = json.loads(f.attrs["model_config"])
        print(json.dumps({"tensors": len(names), "names": names, "state": state,
                          "hidden_size": model["hidden_size"],
                          "word_embeddings_shape": list(f["model/embedding.word_embeddings.weight"].shape)}))


def corrupt(path, how, name=None, index=0):
    with h5py.File(path, "r+") as f:
        if how == "value":
            values = f[name][()]
            flat = values.reshape(-1)
            flat[0] = np.nextafter(flat[0], np.float32(np.inf))
            f[name][()] = values
        elif how == "nan":
            values = f[name][()]
            flat = values.reshape(-1)
            index = index % flat.size
            flat[index] = np.nan
            f[name][()] = values
            print(index)
        elif how == "delete":
            del f[name]
        elif how in ("float64", "reshape"):
            values = f[name][()]
            attributes = dict(f[name].attrs)
            del f[name]
            values = values.astype(np.float64) if how == "float64" else values.T.copy()
            f.create_dataset(name, data=values)
            for key, value in attributes.items():
                f[name].attrs[key] = value
        elif how == "version":
            f.attrs["mt_format_version"] = np.int64(99)
        elif how == "attribute":
            f.attrs[name] = np.array(index, dtype=f.attrs[name].dtype)
        else:
            raise SystemExit("unknown damage %r" % how)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "check":
        check(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "corrupt":
        corrupt(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None,
                int(sys.argv[5]) if len(sys.argv) > 5 else 0)
    else:
        raise SystemExit(__doc__)
