#!/usr/bin/env python3
"""Megatron-core's own IndexedDataset reader/writer, driven by trident's tests.

Only megatron/core/datasets/indexed_dataset.py is loaded: the package's __init__ imports its
training stack, which needs a newer torch than Debian's 1.13, so `megatron`, `megatron.core` and
`megatron.core.datasets` are registered as bare namespace packages and `megatron.core.utils`
(used there only for log_single_rank) is replaced by a one-function stand-in. The reader and
builder code itself is megatron-core's, unmodified.

  megatron_indexed.py dump PREFIX OUT          read with megatron-core, write a flat dump (below)
  megatron_indexed.py write PREFIX SPEC.json [PREFIX SPEC.json ...]
                                               build with megatron-core from {"dtype": "uint16",
                                               "documents": [[[ids...], [ids...]], ...]}
  megatron_indexed.py merge OUT PREFIX...      merge with IndexedDatasetBuilder.add_index

Dump layout (little-endian): int64 sequence count N, int64 document-index count D, int64 dtype
code, int32 lengths[N], int64 document_indices[D], then every sequence's tokens as int64.
"""
import importlib.util
import json
import logging
import struct
import sys
import types

import numpy
import torch


def load_megatron_indexed_dataset():
    spec = importlib.util.find_spec("megatron")
    if spec is None:
        sys.exit("megatron-core is not installed: run scripts/install-python-deps")
    root = list(spec.submodule_search_locations)[0]
    for name, path in [("megatron", root), ("megatron.core", root + "/core"),
                       ("megatron.core.datasets", root + "/core/datasets")]:
        module = types.ModuleType(name)
        module.__path__ = [path]
        sys.modules[name] = module
    utils = types.ModuleType("megatron.core.utils")
    utils.log_single_rank = lambda logger, level, *a, **k: logger.log(level, *a, **k)
    sys.modules["megatron.core.utils"] = utils
    from megatron.core.datasets import indexed_dataset
    return indexed_dataset


def main():
    logging.basicConfig(level=logging.WARNING)
    md = load_megatron_indexed_dataset()
    cmd = sys.argv[1]
    if cmd == "dump":
        prefix, out = sys.argv[2], sys.argv[3]
        ds = md.IndexedDataset(prefix)
        lengths = numpy.asarray(ds.sequence_lengths, dtype="<i4")
        docs = numpy.asarray(ds.document_indices, dtype="<i8")
        code = md.DType.code_from_dtype(ds.index.dtype)
        with open(out, "wb") as f:
            f.write(struct.pack("<qqq", len(lengths), len(docs), code))
            f.write(lengths.tobytes())
            f.write(docs.tobytes())
            for i in range(len(ds)):
                f.write(numpy.asarray(ds[i], dtype="<i8").tobytes())
    elif cmd == "write":
        pairs = sys.argv[2:]
        for prefix, spec_path in zip(pairs[0::2], pairs[1::2]):
            with open(spec_path) as f:
                spec = json.load(f)
            builder = md.IndexedDatasetBuilder(prefix + ".bin",
                                               dtype=getattr(numpy, spec["dtype"]))
            for doc in spec["documents"]:
                for seq in doc:
                    builder.add_item(torch.tensor(seq, dtype=torch.int64))
                builder.end_document()
            builder.finalize(prefix + ".idx")
    elif cmd == "merge":
        out, prefixes = sys.argv[2], sys.argv[3:]
        first = md.IndexedDataset(prefixes[0])
        builder = md.IndexedDatasetBuilder(out + ".bin", dtype=first.index.dtype)
        for p in prefixes:
            builder.add_index(p)
        builder.finalize(out + ".idx")
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
