"""Minimal safetensors reader/writer for the parity scripts: plain Python + torch, no extra
package (the format is an 8-byte little-endian header length, a JSON header, then raw bytes)."""
import json
import struct

import torch

_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}
_TORCH = {name: dtype for dtype, name in _DTYPES.items()}


def write(path, tensors):
    """Writes a dict name -> tensor, in dict order."""
    header, blobs, offset = {}, [], 0
    for name, tensor in tensors.items():
        t = tensor.detach().cpu().contiguous()
        # Reinterpret as bytes so every dtype (bf16 included) serialises without numpy.
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def read(path):
    """Returns a dict name -> tensor."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        buf = bytearray(data[begin:end])
        t = torch.frombuffer(buf, dtype=torch.uint8) if buf else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(_TORCH[entry["dtype"]]).reshape(entry["shape"]).clone()
    return out
