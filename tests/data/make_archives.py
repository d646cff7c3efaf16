#!/usr/bin/env python3
"""Writes the script-model test archives in tests/data/archives/ (committed, so the C++ tests run
without Python and the GPU build, libtorch 2.x, loads archives exported by Debian's torch 1.13).

Good archives (pswitch.export), each with the input it was checked on and the model's output in
Python (`<name>.io.safetensors`, keys `input` and `output`):
  residual_cnn      custom CNN with a residual branch and BatchNorm, with a cross-entropy loss
  tiny_transformer  token embedding tied to the output projection, a root-owned positional
                    embedding, two encoder blocks, with a loss
  masked_classifier a fine-tuned-BERT shape taking input, attention_mask and token_type_ids
                    (keys of the same names in its .io file), with a loss
  residual_cnn_bf16 residual_cnn converted whole to bfloat16 (model.bfloat16()), exported with
                    a bfloat16 input and no loss: a half-precision model, served only

Bad archives, each for one registration error:
  no_table          a plain torch.jit.save file (no layer table, no gates)
  no_gates          a layer table on a model without gate calls
  float64           parameters of dtype float64
  shared_view       one parameter a view of another's memory
  tensor_attribute  a tensor attribute that is neither a parameter nor a buffer
  unknown_op        an archive calling an operator no libtorch has
  unknown_module    a layer table naming a module the archive lacks
  reads_file        a forward pass calling torch.from_file
  forks             a forward pass running code on another thread (torch.jit.fork)
  setstate          a __setstate__ (code that would run while the archive loads)
  parent_reads      a valid export whose forward reads a child's weight before the child runs

And data_dependent.pswitch.pt, a valid export whose layers depend on the input's sign.

Usage: /usr/bin/python3 tests/data/make_archives.py [--out tests/data/archives]
"""
import argparse
import io
import json
import os
import sys
import zipfile
from typing import Tuple

import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))
sys.path.insert(0, os.path.join(ROOT, "tests", "parity"))
import custom_models  # noqa: E402
import safetensors_io  # noqa: E402
from pswitch.exporter import export  # noqa: E402

TABLE = "pswitch/layers.json"


def table(gates, shape, dtype="float32", high=None):
    entry = {"name": "input", "dtype": dtype, "shape": list(shape)}
    if high is not None:
        entry["high"] = high
    return json.dumps({"format": 1, "method": "script", "gates": gates, "inputs": [entry],
                       "target": None, "loss": False})


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x)


class SharedView(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.randn(8))
        self.b = nn.Parameter(self.a.data[:4])  # same storage, another view

    def forward(self, x):
        return x * self.a[:4] + self.b


class TensorAttribute(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.scale = torch.ones(4)  # not a buffer: a plain attribute

    def forward(self, x):
        return self.fc(x) * self.scale


class ParentReads(nn.Module):
    """Reads a child's weight before the child runs: the weight would not have arrived yet."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 4)

    def forward(self, x):
        return self.out(self.fc(x) * self.out.weight.sum())


class ReadsFile(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        secret = torch.from_file("/etc/hostname", size=1, dtype=torch.uint8)
        return self.fc(x) + secret.float().sum()


class Setstate(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return x * self.w

    @torch.jit.export
    def __getstate__(self):
        return (self.w, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[torch.Tensor, bool]):
        self.w = state[0]
        self.training = state[1]


class Forks(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        future = torch.jit.fork(torch.relu, x)
        return self.fc(torch.jit.wait(future))


class DataDependent(nn.Module):
    """Which layers run depends on the input: pswitch cannot pipeline it along one order."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        if bool(x.sum() > 0):
            x = self.a(x)
        return self.b(x)


def save_plain(module, path, extra=None):
    torch.jit.save(torch.jit.script(module), path, _extra_files=extra or {})


def rewrite_code(src, dst, old, new):
    """Copies a TorchScript zip, replacing `old` by `new` in its code files."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if "/code/" in item.filename and item.filename.endswith(".py"):
                data = data.replace(old.encode(), new.encode())
            zout.writestr(item, data)


def write_half(out):
    model = custom_models.make("residual_cnn", seed=1).bfloat16().eval()
    xs = tuple(x.bfloat16() for x in custom_models.example_inputs("residual_cnn", batch=2, seed=2))
    with torch.no_grad():
        y = model(*xs)
    print(export(model, xs, os.path.join(out, "residual_cnn_bf16.pswitch.pt")))
    safetensors_io.write(os.path.join(out, "residual_cnn_bf16.io.safetensors"),
                         {"input": xs[0], "output": y})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "archives"))
    parser.add_argument("--only", nargs="*", help="these good archives only (none of the bad)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    for name in args.only or ("residual_cnn", "tiny_transformer", "masked_classifier",
                              "residual_cnn_bf16"):
        if name == "residual_cnn_bf16":
            write_half(args.out)
            continue
        model = custom_models.make(name, seed=1)
        xs = custom_models.example_inputs(name, batch=2, seed=2)
        with torch.no_grad():
            y = model.eval()(*xs)
        with torch.no_grad():
            out = model(*custom_models.example_inputs(name, batch=2, seed=3))
        if out.dim() == 2:
            target = torch.zeros(out.shape[0], dtype=torch.long)
        else:
            target = torch.zeros(out.shape[:-1], dtype=torch.long)
        path = os.path.join(args.out, f"{name}.pswitch.pt")
        report = export(model, xs, path, loss=nn.CrossEntropyLoss() if out.dim() == 2
                        else (lambda o, t: nn.functional.cross_entropy(o.flatten(0, 1),
                                                                      t.flatten())),
                        example_target=target, target_high=out.shape[-1])
        print(report)
        safetensors_io.write(os.path.join(args.out, f"{name}.io.safetensors"),
                             {**dict(zip(("input", "attention_mask", "token_type_ids"), xs)),
                              "output": y})
    if args.only:
        return

    torch.manual_seed(0)
    save_plain(Small(), os.path.join(args.out, "no_table.pt"))
    save_plain(Small(), os.path.join(args.out, "no_gates.pt"),
               {TABLE: table(["", "fc"], [1, 4])})
    save_plain(Small().double(), os.path.join(args.out, "float64.pt"),
               {TABLE: table(["", "fc"], [1, 4])})
    save_plain(SharedView(), os.path.join(args.out, "shared_view.pt"),
               {TABLE: table([""], [1, 4])})
    save_plain(TensorAttribute(), os.path.join(args.out, "tensor_attribute.pt"),
               {TABLE: table(["", "fc"], [1, 4])})
    save_plain(ReadsFile(), os.path.join(args.out, "reads_file.pt"),
               {TABLE: table(["", "fc"], [1, 4])})
    save_plain(Forks(), os.path.join(args.out, "forks.pt"), {TABLE: table(["", "fc"], [1, 4])})
    try:
        save_plain(Setstate(), os.path.join(args.out, "setstate.pt"),
                   {TABLE: table(["", "fc"], [1, 4])})
    except Exception as error:  # noqa: BLE001 - say which fixture could not be made
        raise SystemExit(f"setstate.pt: {error}")
    export(DataDependent(), torch.ones(1, 4), os.path.join(args.out, "data_dependent.pswitch.pt"))
    export(ParentReads(), torch.ones(1, 4), os.path.join(args.out, "parent_reads.pt"))
    good = os.path.join(args.out, "residual_cnn.pswitch.pt")
    rewrite_code(good, os.path.join(args.out, "unknown_op.pt"), "ops.pswitch.gate",
                 "ops.pswitch_missing.gate")
    # The residual CNN's archive with its table's first leaf renamed.
    with zipfile.ZipFile(good) as z:
        names = [n for n in z.namelist() if n.endswith("extra/" + TABLE)]
        layer_table = json.loads(z.read(names[0]))
    layer_table["gates"][1] = "no_such_module"
    src = good
    dst = os.path.join(args.out, "unknown_module.pt")
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith("extra/" + TABLE):
                data = json.dumps(layer_table).encode()
            zout.writestr(item, data)


if __name__ == "__main__":
    main()
