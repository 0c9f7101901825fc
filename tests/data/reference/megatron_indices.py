"""Builds datasets with megatron-core's own BlendedMegatronDatasetBuilder for the C++ tests.

Usage: python3 megatron_indices.py SPEC.json

SPEC.json: {"cases": [CASE, ...]}, each CASE:
  name           a label, used in output file names
  cache_dir      megatron-core's path_to_cache (its .npy/.txt cache files land here)
  out_dir        where this script writes NAME-summary.json and NAME-<split>-samples.npy
  data_path      the --data-path entries (a list of strings) or null
  per_split_paths [train, valid, test] entries lists (each a list or null) or null
                 (both parsed by megatron-core's get_blend_from_list)
  split          the split string or null
  seq_length, seed
  sizes          [train, valid, test], each an int or null
  tokenizer      the tokenizer's unique identifiers (a JSON object) or null
  drop_last_partial_validation_sequence  (optional, default true)
  num_dump       how many sample ids to dump per split (first, last and evenly spaced ones)

The summary holds, per split, the dataset's class, length, description, hash and the ids dumped;
the samples file holds their tokens as int64 (short samples padded with -1, as Megatron does).
"""
import json
import os
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mcore_import import load_megatron_core  # noqa: E402

load_megatron_core()

import numpy  # noqa: E402
from megatron.core.datasets.blended_dataset import BlendedDataset  # noqa: E402
from megatron.core.datasets.blended_megatron_dataset_builder import (  # noqa: E402
    BlendedMegatronDatasetBuilder,
)
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig  # noqa: E402
from megatron.core.datasets.utils import get_blend_from_list  # noqa: E402


class IdentityOnlyTokenizer:
    """Stands in for a tokenizer: only its unique identifiers matter to index building."""

    def __init__(self, identifiers):
        self.unique_identifiers = (
            None if identifiers is None else OrderedDict(identifiers)
        )
        self.vocab_size = None  # keeps GPTDatasetConfig from forcing a token dtype


def dump_ids(n, k):
    if n == 0 or k == 0:
        return []
    ids = set(range(min(k, n))) | set(range(max(0, n - k), n))
    ids |= set(range(0, n, max(1, n // k)))
    return sorted(ids)


def raw_sample(dataset, i):
    if isinstance(dataset, BlendedDataset):
        d = dataset.dataset_index[i]
        return raw_sample(dataset.datasets[d], dataset.dataset_sample_index[i])
    text, _ = dataset._query_document_sample_shuffle_indices(int(i))
    return text


def run_case(case):
    data_path = case.get("data_path")
    per_split = case.get("per_split_paths")
    blend = None if data_path is None else get_blend_from_list(data_path)
    blend_per_split = (
        None
        if per_split is None
        else [None if p is None else get_blend_from_list(p) for p in per_split]
    )
    config = GPTDatasetConfig(
        random_seed=case["seed"],
        sequence_length=case["seq_length"],
        blend=blend,
        blend_per_split=blend_per_split,
        split=case.get("split"),
        path_to_cache=case["cache_dir"],
        tokenizer=IdentityOnlyTokenizer(case.get("tokenizer")),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        drop_last_partial_validation_sequence=case.get(
            "drop_last_partial_validation_sequence", True
        ),
        mid_level_dataset_surplus=case.get("mid_level_dataset_surplus", 0.005),
    )
    datasets = BlendedMegatronDatasetBuilder(
        GPTDataset, case["sizes"], lambda: True, config
    ).build()
    summary = OrderedDict()
    seq = case["seq_length"] + 1
    for split, ds in zip(["train", "valid", "test"], datasets):
        if ds is None:
            summary[split] = None
            continue
        ids = dump_ids(len(ds), case.get("num_dump", 8))
        samples = numpy.zeros((len(ids), seq), dtype=numpy.int64)
        for row, i in enumerate(ids):
            samples[row] = raw_sample(ds, i)
        numpy.save(
            os.path.join(case["out_dir"], f"{case['name']}-{split}-samples.npy"), samples
        )
        summary[split] = OrderedDict(
            [
                ("class", type(ds).__name__),
                ("length", len(ds)),
                ("description", ds.unique_description),
                ("hash", ds.unique_description_hash),
                ("ids", ids),
            ]
        )
    with open(os.path.join(case["out_dir"], f"{case['name']}-summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    for case in spec["cases"]:
        os.makedirs(case["cache_dir"], exist_ok=True)
        os.makedirs(case["out_dir"], exist_ok=True)
        run_case(case)


if __name__ == "__main__":
    main()
