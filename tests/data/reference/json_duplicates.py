"""Reference for parse_json_strict (tests/data/json_io_test.cc): which JSON texts name a key twice
in one object, by Python's json module with an object_pairs_hook that refuses duplicates (the way
DeepSpeed reads its config). Reads one JSON text per line of argv[1]; writes "dup" or "ok" per line
to argv[2]."""
import json
import sys


class Duplicate(Exception):
    pass


def refuse_duplicates(pairs):
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise Duplicate(key)
        seen.add(key)
    return dict(pairs)


with open(sys.argv[1], encoding="utf-8") as src, open(sys.argv[2], "w") as out:
    for line in src:
        try:
            json.loads(line, object_pairs_hook=refuse_duplicates)
            out.write("ok\n")
        except Duplicate:
            out.write("dup\n")
