# Tensor files ("TRTF"): the Python twin of tests/support/tensor_file.{h,cc}; byte table in
# docs/formats/tensor_file.md. Torch tensors in and out, no numpy. Run as a script to list a file:
#   /usr/bin/python3 tests/reference/tensor_file.py FILE.trtf
"""Read and write TRTF tensor files (magic TRTENSOR, version 1, little-endian)."""

import ctypes
import os
import struct
import sys

import torch

MAGIC = b"TRTENSOR"
VERSION = 1
MAX_NAME_BYTES = 1 << 16
MAX_NDIM = 16

# dtype code in the file <-> torch dtype.
CODE_TO_DTYPE = {0: torch.float32, 1: torch.int32, 2: torch.float64, 3: torch.int64}
DTYPE_TO_CODE = {v: k for k, v in CODE_TO_DTYPE.items()}
CODE_NAMES = {0: "f32", 1: "i32", 2: "f64", 3: "i64"}


class TensorFileError(ValueError):
    """A file that is not a valid tensor file (the C++ reader throws DataError for the same)."""


def _tensor_bytes(t):
    t = t.detach().cpu().contiguous()
    nbytes = t.numel() * t.element_size()
    return ctypes.string_at(t.data_ptr(), nbytes) if nbytes else b""


def write_tensor_file(path, tensors):
    """Writes `tensors` (a dict or a list of (name, tensor) pairs) in order.

    Every tensor must be float32, int32, float64 or int64 (cast first); 0-dim tensors are scalars.
    Writes PATH.tmp and renames it, like the C++ writer.
    """
    items = list(tensors.items()) if isinstance(tensors, dict) else list(tensors)
    if sys.byteorder != "little":
        raise RuntimeError("tensor files hold little-endian data; this host is big-endian")
    parts = [MAGIC, struct.pack("<II", VERSION, len(items))]
    seen = set()
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensor '{name}' is a {type(t).__name__}, not a torch.Tensor")
        if t.dtype not in DTYPE_TO_CODE:
            raise TypeError(f"tensor '{name}' has dtype {t.dtype}; cast to float32/int32/"
                            "float64/int64 first")
        encoded = name.encode("utf-8")
        if not 1 <= len(encoded) <= MAX_NAME_BYTES:
            raise ValueError(f"tensor name length {len(encoded)} outside [1, {MAX_NAME_BYTES}]")
        if name in seen:
            raise ValueError(f"duplicate tensor name '{name}'")
        if t.dim() > MAX_NDIM:
            raise ValueError(f"tensor '{name}' has {t.dim()} dims, at most {MAX_NDIM} allowed")
        seen.add(name)
        parts.append(struct.pack("<I", len(encoded)))
        parts.append(encoded)
        parts.append(struct.pack("<II", DTYPE_TO_CODE[t.dtype], t.dim()))
        parts.append(struct.pack(f"<{t.dim()}q", *t.shape))
        parts.append(_tensor_bytes(t))
    tmp = str(path) + ".tmp"
    with open(tmp, "wb") as f:
        for p in parts:
            f.write(p)
    os.replace(tmp, path)


def read_tensor_file(path):
    """Returns {name: torch.Tensor} in file order. Raises TensorFileError on a bad file."""
    with open(path, "rb") as f:
        buf = bytearray(f.read())
    pos = 0

    def take(n, what):
        nonlocal pos
        if n > len(buf) - pos:
            raise TensorFileError(f"{path}: truncated at byte {pos}: need {n} bytes for {what}, "
                                  f"file has {len(buf) - pos} left")
        start = pos
        pos += n
        return start

    def u32(what):
        return struct.unpack_from("<I", buf, take(4, what))[0]

    take(8, "magic")
    if bytes(buf[:8]) != MAGIC:
        raise TensorFileError(f"{path}: bad magic: expected TRTENSOR, found {bytes(buf[:8])!r}")
    version = u32("version")
    if version != VERSION:
        raise TensorFileError(f"{path}: unsupported version {version} (this reader knows 1)")
    count = u32("record count")
    out = {}
    for index in range(count):
        name_len = u32("name length")
        if not 1 <= name_len <= MAX_NAME_BYTES:
            raise TensorFileError(f"{path}: record {index}: name length {name_len} outside "
                                  f"[1, {MAX_NAME_BYTES}] at byte {pos - 4}")
        at = take(name_len, "name")
        name = bytes(buf[at:at + name_len]).decode("utf-8")
        code = u32("dtype")
        if code not in CODE_TO_DTYPE:
            raise TensorFileError(f"{path}: tensor '{name}': unknown dtype code {code} at byte "
                                  f"{pos - 4}")
        ndim = u32("ndim")
        if ndim > MAX_NDIM:
            raise TensorFileError(f"{path}: tensor '{name}': ndim {ndim} exceeds {MAX_NDIM}")
        shape = struct.unpack_from(f"<{ndim}q", buf, take(8 * ndim, "dims"))
        if any(d < 0 for d in shape):
            raise TensorFileError(f"{path}: tensor '{name}': negative dim in {shape}")
        dtype = CODE_TO_DTYPE[code]
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        at = take(nbytes, "tensor data")
        if name in out:
            raise TensorFileError(f"{path}: duplicate tensor name '{name}'")
        if numel:
            t = torch.frombuffer(buf, dtype=dtype, count=numel, offset=at).clone()
        else:
            t = torch.empty(0, dtype=dtype)
        out[name] = t.reshape(shape)
    if pos != len(buf):
        raise TensorFileError(f"{path}: {len(buf) - pos} trailing bytes after {count} records")
    return out


def describe(tensors):
    """One line per tensor: name, dtype, shape and (for floats) min/max/mean of |x|."""
    lines = []
    for name, t in tensors.items():
        line = f"{name:48s} {CODE_NAMES[DTYPE_TO_CODE[t.dtype]]} {tuple(t.shape)}"
        if t.numel() == 1:
            line += f" = {t.item()!r}"
        elif t.numel() and t.is_floating_point():
            line += (f" min {t.min().item():.6g} max {t.max().item():.6g}"
                     f" mean|x| {t.abs().mean().item():.6g}")
        lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tensor_file.py FILE.trtf")
    print(describe(read_tensor_file(sys.argv[1])))
