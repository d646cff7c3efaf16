#!/usr/bin/env python3
"""Writes tests/data/archives/escapes/: archives that try to reach memory outside the tensors they
are given (committed, so the C++ tests run without Python). A worker's tensors are views into one
shared arena, so each of these would read or write another tenant's inputs or another model's
weights if pswitchd ran it. Every one must be refused at registration; escapes.json maps each
file to the text its refusal must contain (models/script_model_test.cc, tests/isolation_e2e_test.cc).

Also two archives that register and serve (tests/isolation_e2e_test.cc):
  passthrough     returns its input times a parameter of ones (the victim's activations in the
                  lease hold its input)
  lease_reader    computes like a Linear layer at registration, but for batches of 3 or more
                  returns torch.empty_like of that: uninitialised lease memory, which held the
                  previous task's activations until leases were cleared between tenants
  wide_output     returns a tensor wider than the one it showed at registration for batches of
                  3 or more (refused by the output check)

Usage: /usr/bin/python3 tests/data/make_escape_archives.py [--out tests/data/archives]
Made with Debian's torch 1.13.
"""
import argparse
import importlib.util
import io
import json
import os
import pickletools
import sys
import tempfile
import zipfile
from typing import List

import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
from pswitch.exporter import export  # noqa: E402

TABLE = "pswitch/layers.json"
WIDTH = 1024  # passthrough / lease_reader features


def table(gates, shape):
    return json.dumps({"format": 1, "method": "script", "gates": gates,
                       "inputs": [{"name": "input", "dtype": "float32", "shape": list(shape)}],
                       "target": None, "loss": False})


def escape(body):
    """A module with one Linear whose forward runs `body` (TorchScript source over x, self.fc)."""
    source = ("import torch\nfrom torch import nn\nfrom typing import List\n"
              "class M(nn.Module):\n"
              "    def __init__(self):\n"
              "        super().__init__()\n"
              "        self.fc = nn.Linear(4, 4)\n"
              "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
              "        y = self.fc(x)\n" +
              "".join(f"        {line}\n" for line in body.strip().splitlines()) +
              "        return y\n")
    # TorchScript reads a module's source from its file: a real module per escape.
    directory = tempfile.mkdtemp(prefix="pswitch-escape-")
    path = os.path.join(directory, "escape_module.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(f"escape_{abs(hash(body))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.M()


# name -> (TorchScript body, the text the refusal must contain). Each body is an attack that
# works in plain torch 1.13.
ESCAPES = {
    # The reported one: a view at a huge storage offset (the bounds check's product overflows).
    "as_strided": ("y = torch.as_strided(y, [4, 4], [1, 1], 4611686018427387904)",
                   "calls aten::as_strided,"),
    "as_strided_inplace": ("y = y.as_strided_([16], [1], 0)", "calls aten::as_strided_,"),
    "as_strided_scatter": ("y = torch.as_strided_scatter(y, torch.zeros(4), [4], [1], 0)",
                           "calls aten::as_strided_scatter"),
    # set_ with raw offset, sizes and strides over another tensor's storage.
    "set_offset": ("z = torch.empty([0])\nz.set_(self.fc.weight, 1000000, [16], [1])\ny = y + z[0]",
                   "calls aten::set_"),
    "set_source": ("z = torch.empty([0])\nz.set_(self.fc.weight)\ny = y + z.sum()",
                   "calls aten::set_"),
    # Growing a view over its storage's spare bytes.
    "resize": ("z = self.fc.weight.view([-1])[:1]\nz.resize_([16])\ny = y + z.sum()",
               "calls aten::resize_"),
    "resize_as": ("z = self.fc.weight.view([-1])[:1]\nz.resize_as_(self.fc.weight)\ny = y + z.sum()",
                  "calls aten::resize_as_"),
    # Raw strides without a bounds check at all.
    "reshape_alias": ("y = torch.ops.aten._reshape_alias(y, [4, 4], [1000000, 1])",
                      "calls aten::_reshape_alias"),
    "empty_strided": ("y = y + torch.empty_strided([4, 4], [1, 1]).sum()",
                      "calls aten::empty_strided"),
    "unsafe_view": ("y = torch.ops.aten._unsafe_view(y, [-1]).view([-1, 4])",
                    "calls aten::_unsafe_view"),
    "unsafe_split": ("y = torch.unsafe_split(y, 1)[0]", "calls aten::unsafe_split"),
    # index_put_ with its checks switched off.
    "index_put_unchecked": (
        "y = torch.ops.aten._index_put_impl_(y, [torch.tensor([1000000])], torch.ones([4]),"
        " False, True)", "calls aten::_index_put_impl_"),
    # Sparse tensors: their indices are a writable tensor that to_dense trusts.
    "sparse_indices": ("s = y.to_sparse()\ns.indices().fill_(1000000)\ny = s.to_dense()",
                       "calls aten::to_sparse"),
    "sparse_layout": ("s = torch.zeros([4, 4], layout=torch.sparse_coo)\ny = y + s.to_dense()",
                      "a layout other than a constant torch.strided"),
    "sparse_coo_unsafe": (
        "s = torch.ops.aten._sparse_coo_tensor_unsafe(torch.tensor([[1000000], [0]]),"
        " torch.ones([1]), [4, 4])\ny = y + s.to_dense()", "calls aten::_sparse_coo_tensor_unsafe"),
    # Nested tensors from raw offsets.
    "nested_view": (
        "n = torch.ops.aten._nested_view_from_buffer(y.view([-1]), torch.tensor([[1000000]]),"
        " torch.tensor([[1]]), [0])\ny = y + torch.ops.aten.to_padded_tensor(n, 0.0).sum()",
        "calls aten::_nested_view_from_buffer"),
    # Quantized tensors made from raw integer representations.
    "quantized": ("q = torch._make_per_tensor_quantized_tensor(torch.ones([4], dtype=torch.int8),"
                  " 1.0, 0)\ny = y + q.dequantize().sum()",
                  "calls aten::_make_per_tensor_quantized_tensor"),
}


def save_plain(module, path, gates, shape):
    torch.jit.save(torch.jit.script(module), path, _extra_files={TABLE: table(gates, shape)})


class OutOfStorageBuffer(nn.Module):
    """A buffer whose pickled storage offset is patched past its storage (make_oob_buffer)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        big = torch.arange(8, dtype=torch.float32)
        self.register_buffer("window", big[5:8])  # storage offset 5: patched to 100000

    def forward(self, x):
        return self.fc(x) + self.window.sum()


class OutOfStorageList(nn.Module):
    """The same window in a List[Tensor] attribute: neither a parameter nor a buffer, so it would
    stay in the worker's own memory, read past its storage."""

    window_list: List[torch.Tensor]

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        big = torch.arange(8, dtype=torch.float32)
        self.window_list = [big[5:8]]  # storage offset 5: patched to 100000

    def forward(self, x):
        return self.fc(x) + self.window_list[0].sum()


def make_oob_buffer(path, module):
    """The unpickler rebuilds a tensor with the archive's offset and sizes and checks neither."""
    buf = io.BytesIO()
    save_plain(module, buf, ["", "fc"], [1, 4])
    buf.seek(0)
    with zipfile.ZipFile(buf) as zin, zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith("/data.pkl"):
                # The window's rebuild call: the persistent storage id (BINPERSID, BINPUT), then
                # offset 5 (K\x05), then its size tuple (3,). Only that offset is patched.
                ops = list(pickletools.genops(data))
                patched = None
                for i, (op, arg, pos) in enumerate(ops):
                    if (op.name == "BININT1" and arg == 5 and 2 <= i < len(ops) - 2
                            and ops[i - 2][0].name == "BINPERSID"
                            and ops[i + 2][0].name == "BININT1" and ops[i + 2][1] == 3):
                        patched = data[:pos] + b"J" + (100000).to_bytes(4, "little") + data[pos + 2:]
                        break
                if patched is None:
                    raise SystemExit("oob_buffer: the window's storage offset was not found")
                data = patched
            zout.writestr(item, data)


class Passthrough(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(WIDTH))

    def forward(self, x):
        return x * self.scale


class LeaseReader(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, WIDTH)

    def forward(self, x):
        y = self.fc(x)
        if x.size(0) >= 3:  # never at registration (batches 1 and 2)
            return torch.empty_like(y)
        return y


class WideOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        if x.size(0) >= 3:
            return torch.cat([y, y, y, y], 1)  # 4x the registered width
        return y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "archives"))
    args = parser.parse_args()
    out = os.path.join(args.out, "escapes")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    expected = {}
    for name, (body, refusal) in ESCAPES.items():
        path = os.path.join(out, f"{name}.pt")
        save_plain(escape(body), path, ["", "fc"], [1, 4])
        expected[f"{name}.pt"] = refusal
    make_oob_buffer(os.path.join(out, "oob_buffer.pt"), OutOfStorageBuffer())
    expected["oob_buffer.pt"] = "buffer 'window' addresses memory outside its storage"
    make_oob_buffer(os.path.join(out, "oob_list_attribute.pt"), OutOfStorageList())
    expected["oob_list_attribute.pt"] = "tensor attribute 'window_list' is neither"
    with open(os.path.join(out, "escapes.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")

    export(Passthrough(), torch.ones(2, WIDTH), os.path.join(args.out, "passthrough.pswitch.pt"))
    export(LeaseReader(), torch.ones(2, 4), os.path.join(args.out, "lease_reader.pswitch.pt"))
    export(WideOutput(), torch.ones(2, 4), os.path.join(args.out, "wide_output.pswitch.pt"))


if __name__ == "__main__":
    main()
