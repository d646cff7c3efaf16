#!/usr/bin/env python3
"""Parity of pswitch's libtorch model zoo against torchvision on the CPU.

For ResNet-50, Inception-v3 (eval) and VGG-19: builds the torchvision model with random weights
(BatchNorm statistics and affine terms randomised too, so they are exercised), writes weights and
an input as safetensors, runs build/bin/run-model on them and compares the outputs: the maximum
absolute difference must stay below 1e-4 of the output scale (max |reference|). Inputs are small
(batch 1-2, the smallest image sizes the architectures accept) to keep CI fast.

Inception-v3 is compared as torchvision builds it without pretrained weights: aux_logits=True,
transform_input=False (torchvision switches transform_input on only when loading its weights).

Exit codes: 0 pass, 1 mismatch or error, 77 skipped (torchvision not importable).
Usage: torchvision_parity.py --run-model build/bin/run-model [--models resnet50,vgg19]
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

CASES = {
    # name: (torchvision constructor, input shape)
    "resnet50": (lambda: torchvision.models.resnet50(), (2, 3, 64, 64)),
    "inception_v3": (lambda: torchvision.models.inception_v3(init_weights=True), (1, 3, 75, 75)),
    "vgg19": (lambda: torchvision.models.vgg19(), (1, 3, 32, 32)),
}
TOLERANCE = 1e-4


def randomise_norms(model):
    """torchvision initialises BatchNorm to the identity; random statistics test them for real."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.1)
                module.running_mean.normal_(0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
                module.num_batches_tracked.fill_(7)


def check(name, run_model, workdir):
    torch.manual_seed(0)
    constructor, shape = CASES[name]
    model = constructor().eval()
    randomise_norms(model)
    x = torch.randn(shape)
    with torch.no_grad():
        reference = model(x)
    weights = os.path.join(workdir, f"{name}.weights.safetensors")
    inputs = os.path.join(workdir, f"{name}.input.safetensors")
    outputs = os.path.join(workdir, f"{name}.output.safetensors")
    safetensors_io.write(weights, model.state_dict())
    safetensors_io.write(inputs, {"input": x})
    start = time.time()
    result = subprocess.run([run_model, "--model", name, "--weights", weights, "--input", inputs,
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
    print(f"{'PASS' if ok else 'FAIL'} {name}: input {list(shape)}, max |diff| {diff:.3e}, "
          f"output scale {scale:.3e}, relative {diff / max(scale, 1e-12):.3e} "
          f"(limit {TOLERANCE:.0e}); run-model {time.time() - start:.1f} s")
    return ok


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-model", required=True)
    parser.add_argument("--models", default=",".join(CASES))
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}")
    ok = True
    with tempfile.TemporaryDirectory(prefix="pswitch-parity-") as workdir:
        for name in args.models.split(","):
            ok = check(name, args.run_model, workdir) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
