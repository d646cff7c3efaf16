#!/usr/bin/env python3
"""Writes the benchmark archives in tests/data/archives/ (committed: the C++ benchmarks run
without Python).

  corner_probe  reads one pixel per image: [N, 3, H, W] float32 -> [N, 3]. A model with almost no
                compute, so bench-dataplane measures how a request's bytes reach the worker, not
                the model; any H and W are accepted (pswitchd checks an input's rank and dtype).

Usage: /usr/bin/python3 tests/data/make_bench_archives.py [--out tests/data/archives]
"""
import argparse
import os
import sys

import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
from pswitch.exporter import export  # noqa: E402


class CornerProbe(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return self.fc(x[:, :, 0, 0])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "archives"))
    args = parser.parse_args()
    torch.manual_seed(0)
    export(CornerProbe(), torch.ones(2, 3, 8, 8), os.path.join(args.out, "corner_probe.pswitch.pt"))


if __name__ == "__main__":
    main()
