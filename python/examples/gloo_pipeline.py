#!/usr/bin/env python3
"""A pipeline-parallel training job whose idle waits pswitchd fills with other work.

torch.distributed (gloo), one process per stage on this machine, a small MLP split into stages,
GPipe: every microbatch's forward through all stages, then every backward. A stage sits idle
while it waits for its neighbour's activation (forward) or gradient (backward); each such wait
is wrapped in pswitch.BubbleReporter.idle(), which measures the bubbles over the warm-up
iterations, registers the stage's bubble cycle with pswitchd (GPU = the stage's index) and from
then on announces every bubble. Stage 0 submits a fill job once its cycle is registered and
reports, at the end, how much of it ran inside the bubbles.

    build/bin/pswitchd --gpus 2 --preload= &
    python3 python/examples/gloo_pipeline.py --server 127.0.0.1:7300 --iterations 12
"""
import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import pswitch

WIDTH = 256


def stage_model(rank, stages):
    torch.manual_seed(rank)
    layers = []
    for _ in range(2):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    if rank == stages - 1:
        layers.append(nn.Linear(WIDTH, 10))
    return nn.Sequential(*layers)


def run_stage(rank, args, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.stages)
    model = stage_model(rank, args.stages)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    last = rank == args.stages - 1
    client = pswitch.Client(args.server, token=args.token)
    reporter = pswitch.BubbleReporter(client, gpu=rank, warmup_iterations=args.warmup)
    job = None
    data = torch.Generator().manual_seed(0)
    for iteration in range(args.iterations):
        reporter.iteration_start()
        if rank == 0 and job is None and reporter.cycle is not None:
            job = client.submit_fill("synthetic", steps=args.fill_steps, step=0.001,
                                     memory_bytes=1 << 20, synthetic_step=0.001)
        outputs, inputs = [], []
        for _ in range(args.microbatches):  # forward of every microbatch
            if rank == 0:
                x = torch.randn(args.batch, WIDTH, generator=data)
            else:
                x = torch.empty(args.batch, WIDTH)
                with reporter.idle(free_bytes=args.free_bytes):
                    dist.recv(x, src=rank - 1)
                x.requires_grad_()
            y = model(x)
            if not last:
                dist.send(y.detach(), dst=rank + 1)
            inputs.append(x)
            outputs.append(y)
        optimizer.zero_grad()
        losses = []
        for x, y in zip(reversed(inputs), reversed(outputs)):  # backward, last microbatch first
            if last:
                target = torch.zeros(args.batch, dtype=torch.long)
                loss = nn.functional.cross_entropy(y, target)
                losses.append(loss.item())
                loss.backward()
            else:
                grad = torch.empty_like(y)
                with reporter.idle(free_bytes=args.free_bytes):
                    dist.recv(grad, src=rank + 1)
                y.backward(grad)
            if rank > 0:
                dist.send(x.grad, dst=rank - 1)
        optimizer.step()
        # The iteration's end: every stage waits for the others (an idle wait too).
        with reporter.idle(free_bytes=args.free_bytes):
            dist.barrier()
        if last and losses:
            print(f"iteration {iteration}: loss {sum(losses) / len(losses):.4f}", flush=True)
    if rank == 0:
        status = client.fill_status(job.job_id) if job is not None else None
        stats = client.fill_stats()
        report = {"cycle": reporter.cycle, "job": job.job_id if job else None,
                  "steps_done": status.steps_done if status else 0,
                  "bubbles": status.bubbles if status else 0,
                  "fill_steps_total": stats.steps, "bubble_time_s": stats.bubble_time_s,
                  "fill_step_time_s": stats.fill_step_time_s}
        print(json.dumps(report), flush=True)
        if args.report:
            with open(args.report, "w") as f:
                json.dump(report, f)
        if job is not None and status.state != "stopped":
            client.cancel_fill(job.job_id)
    client.close()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="127.0.0.1:7300")
    parser.add_argument("--token", default=None)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--fill-steps", type=int, default=100000)
    parser.add_argument("--free-bytes", type=int, default=256 << 20,
                        help="device memory a stage leaves to fill work while it waits (on a "
                             "GPU: what torch.cuda.mem_get_info reports free)")
    parser.add_argument("--report", default=None, help="write stage 0's summary here (JSON)")
    args = parser.parse_args()
    start = time.monotonic()
    mp.spawn(run_stage, args=(args, free_port()), nprocs=args.stages, join=True)
    print(f"done in {time.monotonic() - start:.1f} s")


if __name__ == "__main__":
    main()
