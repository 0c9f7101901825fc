"""BigScience's --*-weighted-split-paths datasets, for tests/data/split_paths_test.cc.

A reimplementation, written for these tests from the rules of BigScience's Megatron-DeepSpeed
(bigscience-workshop/Megatron-DeepSpeed: megatron/arguments.py parse_data_paths and
parse_data_paths_path; megatron/data/gpt_dataset.py build_dataset_group, _build_single_datasets,
_build_index_mappings, _num_epochs, _build_doc_idx, _build_sample_idx, _build_shuffle_idx;
megatron/data/dataset_utils.py get_split_by_range_, analyze_data_prefix,
get_datasets_weights_and_num_samples; megatron/data/blendable_dataset.py and helpers.cpp
build_blending_indices). None of trident's code is used: the shuffles are numpy's own
RandomState, the documents are read with megatron-core's IndexedDataset, the arrays are written
with numpy.save under BigScience's cache file names.

Usage: python3 bigscience_split_paths.py SPEC.json

SPEC.json: {"cases": [CASE, ...]}, each CASE:
  name, out_dir       this case's files go to out_dir (the index caches under their BigScience
                      names, with the prefix's directory dropped; summary.json; blend arrays)
  train, valid, test  lists of group texts (as the flags take them), or
  train_file, ...     the -path forms: a file to read as parse_data_paths_path does
  seq_length, seed
  sizes               [train, valid, test] samples requested per group
  num_dump            sample ids to dump per group

summary.json: {"groups": {split: [{"name", "kind": "gpt" | "blend", "length", "files": [...],
"datasets": [{"prefix", "range": [lo, hi], "num_samples", "num_epochs", "separate_last_epoch",
"separate_at_0_80"}], "ids": [...]}]}, "parsed": {split: [[name, [[weight, range, path],
...]], ...]}}, plus per group <split>-<name>-dataset_index.npy / -dataset_sample_index.npy (blends,
over BigScience's whole length) and <split>-<name>-samples.npy (the dumped samples' tokens, int64).
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mcore_import import load_megatron_core  # noqa: E402

load_megatron_core()

import numpy as np  # noqa: E402
from megatron.core.datasets.indexed_dataset import IndexedDataset  # noqa: E402


# ---- the flags (megatron/arguments.py) -----------------------------------------------------

def parse_groups(values, option):
    """parse_data_paths: -> [(name, [(weight, range, path), ...]), ...]."""
    if option == "--train-weighted-split-paths":
        assert len(values) == 1, "only one training group"
    for v in values:
        rest = ":".join(v.split(":")[1:])
        for d in rest.split(","):
            assert len(d.split()) == 3, "WEIGHT START:END PATH"
            start, end = d.split()[1].split(":")
            assert float(start) < float(end)
    groups = []
    for v in values:
        name = v.split(":")[0]
        rest = ":".join(v.split(":")[1:]).strip()
        groups.append((name, [tuple(d.split()[:3]) for d in rest.split(",")]))
    return groups


def read_groups_file(path):
    """parse_data_paths_path: one line of quoted groups."""
    with open(path, "r") as f:
        lines = f.readlines()
    assert len(lines) == 1, "one line"
    assert lines[0][-2:] == "\"\n" and lines[0][0] == "\"", "quoted groups"
    return lines[0][1:-2].split("\" \"")


# ---- dataset_utils.py ----------------------------------------------------------------------

def split_by_range(range_string, size):
    splits = [float(i) for i in range_string.split(":")]
    assert len(splits) == 2
    assert splits[0] <= 1 and splits[1] <= 1
    assert sum(splits) > 0.0
    return [round(s * float(size)) for s in splits]


def weights_and_num_samples(weights, num_samples):
    weights = [float(w) for w in weights]
    total = 0.0
    for w in weights:
        total += w
    assert total > 0.0
    weights = [w / total for w in weights]
    return weights, [int(math.ceil(num_samples * w * 1.005)) for w in weights]


# ---- gpt_dataset.py --------------------------------------------------------------------------

def num_epochs_for(tokens_per_epoch, seq_length, num_samples):
    epochs, total = 0, 0
    while True:
        epochs += 1
        total += tokens_per_epoch
        if (total - 1) // seq_length >= num_samples:
            return epochs


def doc_idx_for(documents, num_epochs, rng, separate_last_epoch):
    if not separate_last_epoch or num_epochs == 1:
        doc_idx = np.mgrid[0:num_epochs, 0:len(documents)][1]
        doc_idx[:] = documents
        doc_idx = doc_idx.reshape(-1).astype(np.int32)
        rng.shuffle(doc_idx)
        return doc_idx
    first = doc_idx_for(documents, num_epochs - 1, rng, False)
    last = doc_idx_for(documents, 1, rng, False)
    return np.concatenate((first, last))


def sample_idx_for(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch):
    num_samples = (num_epochs * tokens_per_epoch - 1) // seq_length
    out = np.zeros([num_samples + 1, 2], dtype=np.int32)
    pos, offset = 0, 0
    sizes = sizes.tolist()
    doc_idx = doc_idx.tolist()
    for s in range(1, num_samples + 1):
        remaining = seq_length + 1
        while remaining != 0:
            length = sizes[doc_idx[pos]] - offset
            remaining -= length
            if remaining <= 0:
                offset += remaining + length - 1
                remaining = 0
            else:
                pos += 1
                offset = 0
        out[s][0] = pos
        out[s][1] = offset
    return out


def shuffle_idx_for(num_samples, total_size, rng):
    dtype = np.uint32 if total_size < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(0, num_samples, 1, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, 1, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate((first, last))


class BigScienceGPT:
    def __init__(self, name, prefix, documents, indexed, num_samples, seq_length, seed, out_dir):
        sizes = indexed.sequence_lengths
        tokens_per_epoch = int(np.sum(sizes[documents]))
        num_epochs = num_epochs_for(tokens_per_epoch, seq_length, num_samples)
        rng = np.random.RandomState(seed=seed)
        stem = os.path.join(out_dir, "{}_{}_indexmap_{}ns_{}sl_{}s_".format(
            os.path.basename(prefix), name, num_samples, seq_length, seed))
        separate, separate_at_0_80 = False, False
        if num_epochs > 1:
            minus_one = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length
            last = num_samples - minus_one
            per_epoch = (tokens_per_epoch - 1) // seq_length
            assert 0 <= last <= per_epoch
            separate = last < int(0.95 * per_epoch)
            separate_at_0_80 = last < int(0.80 * per_epoch)
        doc_idx = doc_idx_for(documents, num_epochs, rng, separate)
        sample_idx = sample_idx_for(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch)
        first = minus_one if separate else sample_idx.shape[0] - 1
        shuffle_idx = shuffle_idx_for(first, sample_idx.shape[0] - 1, rng)
        self.files = []
        for suffix, array in (("doc_idx.npy", doc_idx), ("sample_idx.npy", sample_idx),
                              ("shuffle_idx.npy", shuffle_idx)):
            np.save(stem + suffix, array, allow_pickle=True)
            self.files.append(os.path.basename(stem + suffix))
        self.indexed, self.doc_idx, self.sample_idx, self.shuffle_idx = (
            indexed, doc_idx, sample_idx, shuffle_idx)
        self.info = {"prefix": prefix, "range": [int(documents[0]), int(documents[-1]) + 1],
                     "num_samples": num_samples, "num_epochs": num_epochs,
                     "separate_last_epoch": separate, "separate_at_0_80": separate_at_0_80}

    def __len__(self):
        return self.sample_idx.shape[0] - 1

    def __getitem__(self, idx):
        idx = self.shuffle_idx[idx]
        f, l = self.sample_idx[idx][0], self.sample_idx[idx + 1][0]
        of, ol = self.sample_idx[idx][1], self.sample_idx[idx + 1][1]
        get = self.indexed.get
        if f == l:
            return np.array(get(self.doc_idx[f], offset=of, length=ol - of + 1), dtype=np.int64)
        parts = [get(self.doc_idx[f], offset=of)]
        for i in range(f + 1, l):
            parts.append(get(self.doc_idx[i]))
        parts.append(get(self.doc_idx[l], length=ol + 1))
        return np.concatenate(parts).astype(np.int64)


class BigScienceBlend:
    def __init__(self, datasets, weights):
        self.datasets = datasets
        self.size = sum(len(d) for d in datasets)
        weights = np.array(weights, dtype=np.float64)
        weights /= np.sum(weights)
        assert len(datasets) < 255
        self.dataset_index = np.zeros(self.size, dtype=np.uint8)
        self.dataset_sample_index = np.zeros(self.size, dtype=np.int64)
        counts = [0] * len(datasets)
        w = weights.tolist()
        di, dsi = self.dataset_index, self.dataset_sample_index
        for k in range(self.size):
            kd = max(float(k), 1.0)
            best, best_error = 0, w[0] * kd - counts[0]
            for d in range(1, len(w)):
                error = w[d] * kd - counts[d]
                if error > best_error:
                    best, best_error = d, error
            di[k] = best
            dsi[k] = counts[best]
            counts[best] += 1

    def __len__(self):
        return self.size

    def __getitem__(self, idx):
        return self.datasets[self.dataset_index[idx]][self.dataset_sample_index[idx]]


def dump_ids(n, k):
    ids = set(range(min(k, n))) | set(range(max(0, n - k), n))
    ids |= set(range(0, n, max(1, n // k)))
    return sorted(ids)


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    indexed = {}
    for case in spec["cases"]:
        out_dir = case["out_dir"]
        os.makedirs(out_dir, exist_ok=True)
        summary = {"groups": {}, "parsed": {}}
        for s, split in enumerate(("train", "valid", "test")):
            values = case.get(split)
            if case.get(split + "_file"):
                values = read_groups_file(case[split + "_file"])
            if not values:
                continue
            groups = parse_groups(values, "--{}-weighted-split-paths".format(split))
            summary["parsed"][split] = [[n, [list(d) for d in ds]] for n, ds in groups]
            summary["groups"][split] = []
            n = case["sizes"][s]
            for name, entries in groups:
                def single(prefix, range_string, num_samples):
                    if prefix not in indexed:
                        indexed[prefix] = IndexedDataset(prefix)
                    ds = indexed[prefix]
                    lo, hi = split_by_range(range_string, ds.sequence_lengths.shape[0])
                    assert hi > lo
                    documents = np.arange(lo, hi, 1, dtype=np.int32)
                    return BigScienceGPT(name, prefix, documents, ds, num_samples,
                                         case["seq_length"], case["seed"], out_dir)
                if len(entries) == 1:
                    dataset = single(entries[0][2], entries[0][1], n)
                    parts = [dataset]
                    record = {"name": name, "kind": "gpt"}
                else:
                    weights, counts = weights_and_num_samples([e[0] for e in entries], n)
                    parts = [single(e[2], e[1], c) for e, c in zip(entries, counts)]
                    dataset = BigScienceBlend(parts, weights)
                    base = os.path.join(out_dir, "{}-{}-".format(split, name))
                    # uint8 in BigScience; saved as int16 (the same values) for IndexArray.
                    np.save(base + "dataset_index.npy", dataset.dataset_index.astype(np.int16))
                    np.save(base + "dataset_sample_index.npy", dataset.dataset_sample_index)
                    record = {"name": name, "kind": "blend"}
                record["length"] = len(dataset)
                record["files"] = [f for p in parts for f in p.files]
                record["datasets"] = [p.info for p in parts]
                ids = dump_ids(min(n, len(dataset)), case["num_dump"])
                record["ids"] = ids
                rows = [dataset[i] for i in ids]
                assert all(len(r) == case["seq_length"] + 1 for r in rows)
                np.save(os.path.join(out_dir, "{}-{}-samples.npy".format(split, name)),
                        np.array(rows, dtype=np.int64))
                summary["groups"][split].append(record)
        with open(os.path.join(out_dir, "summary.json"), "w") as f:
            json.dump(summary, f)


if __name__ == "__main__":
    main()
