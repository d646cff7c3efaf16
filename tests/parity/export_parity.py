#!/usr/bin/env python3
"""Parity of your own models, exported with pswitch.export, between Python and pswitch's C++.

For models no zoo has (a custom CNN with a residual branch, a small transformer with tied
embeddings and a root-owned positional embedding) and torchvision models exported from Python
(ResNet-18, MobileNetV2; random weights, BatchNorm statistics randomised): exports the model,
runs build/bin/run-model --archive on an input (libtorch loading the archive, the layer gates
in place), and compares the output with the model run in Python on the same weights: the maximum
absolute difference must stay below 1e-4 of the output scale. Also exports a model TorchScript
cannot script, which must fall back to tracing and still match.

Exit codes: 0 pass, 1 mismatch or error, 77 skipped (torch/torchvision not importable).
Usage: export_parity.py --run-model build/bin/run-model [--models residual_cnn,resnet18]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

try:
    import torch
    import torchvision
except ImportError as error:  # ctest maps 77 to SKIPPED
    print(f"SKIPPED: torch/torchvision not importable ({error}); "
          "install python3-torchvision (tools/install-deps.sh)")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))
import custom_models  # noqa: E402
import safetensors_io  # noqa: E402
from pswitch.exporter import export  # noqa: E402

TOLERANCE = 1e-4


class NotScriptable(torch.nn.Module):
    """Its forward uses a Python-only construct (a generator expression), so only tracing works."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(3)])

    def forward(self, x):
        return sum(layer(x) for layer in self.layers)


def randomise_norms(model):
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.1)
                module.running_mean.normal_(0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
    return model


CASES = {
    # name: (constructor, input, expected export method)
    "residual_cnn": (lambda: custom_models.make("residual_cnn", 3),
                     lambda: custom_models.example_input("residual_cnn", 2, 4), "script"),
    "tiny_transformer": (lambda: custom_models.make("tiny_transformer", 3),
                         lambda: custom_models.example_input("tiny_transformer", 2, 4), "script"),
    "masked_classifier": (lambda: custom_models.make("masked_classifier", 3),
                          lambda: custom_models.example_inputs("masked_classifier", 2, 4),
                          "script"),
    "resnet18": (lambda: randomise_norms(torchvision.models.resnet18()),
                 lambda: torch.randn(1, 3, 64, 64), "script"),
    "mobilenet_v2": (lambda: randomise_norms(torchvision.models.mobilenet_v2()),
                     lambda: torch.randn(1, 3, 64, 64), "script"),
    "not_scriptable": (NotScriptable, lambda: torch.randn(2, 8), "trace"),
}


def check(name, run_model, workdir):
    torch.manual_seed(0)
    constructor, make_input, method = CASES[name]
    model = constructor().eval()
    xs = make_input()
    xs = xs if isinstance(xs, tuple) else (xs,)
    with torch.no_grad():
        reference = model(*xs)
    archive = os.path.join(workdir, f"{name}.pswitch.pt")
    inputs = os.path.join(workdir, f"{name}.input.safetensors")
    outputs = os.path.join(workdir, f"{name}.output.safetensors")
    report = export(model, xs, archive)
    if report.method != method:
        print(f"FAIL {name}: exported by {report.method}, expected {method} "
              f"({report.script_error})")
        return False
    safetensors_io.write(inputs, dict(zip(("input", "attention_mask", "token_type_ids"), xs)))
    start = time.time()
    result = subprocess.run([run_model, "--archive", archive, "--input", inputs,
                             "--output", outputs], capture_output=True, text=True)
    if result.returncode != 0:
        print(f"FAIL {name}: run-model exited {result.returncode}\n{result.stderr}")
        return False
    ours = safetensors_io.read(outputs)["output"]
    if ours.shape != reference.shape:
        print(f"FAIL {name}: output shape {tuple(ours.shape)} != {tuple(reference.shape)}")
        return False
    scale = reference.abs().max().item()
    diff = (ours - reference).abs().max().item()
    ok = diff <= TOLERANCE * max(scale, 1e-12)
    print(f"{'PASS' if ok else 'FAIL'} {name} ({report.method}, {report.gates} gates): "
          f"max |diff| {diff:.3e}, output scale {scale:.3e}; run-model {time.time() - start:.1f} s")
    return ok


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-model", required=True)
    parser.add_argument("--models", default=",".join(CASES))
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}")
    ok = True
    with tempfile.TemporaryDirectory(prefix="pswitch-export-parity-") as workdir:
        for name in args.models.split(","):
            ok = check(name, args.run_model, workdir) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
