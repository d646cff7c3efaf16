#!/usr/bin/env python3
"""Parity of pswitch's BERT (bert_base / bert_large) against Hugging Face transformers.

NOT RUN IN CI: CI has no `transformers` package. Run it on the GPU machine (or any machine where
`import transformers` works), after building run-model:

    python3 tests/parity/bert_parity.py --run-model build/bin/run-model [--device cuda] \
        [--model bert_base] [--layers 12] [--batch 2] [--seq 32]

It builds transformers.BertForSequenceClassification with the registry's configuration and random
weights (LayerNorm affine terms randomised too), writes the weights and an input (token ids with a
padded tail in attention_mask, mixed token_type_ids) as safetensors, runs run-model and compares
the logits: max |diff| must be below 1e-4 of the output scale. HF's non-persistent buffers
(embeddings.position_ids / token_type_ids) are not weights and are dropped from the checkpoint.

Exit codes: 0 pass, 1 mismatch or error, 77 skipped (transformers not importable).
"""
import argparse
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
except ImportError as error:
    print(f"SKIPPED: torch/transformers not importable ({error})")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

SIZES = {"bert_base": (768, 12, 12), "bert_large": (1024, 24, 16)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-model", required=True)
    parser.add_argument("--model", default="bert_base", choices=sorted(SIZES))
    parser.add_argument("--layers", type=int, default=0, help="override num_hidden_layers")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=32)
    args = parser.parse_args()

    hidden, layers, heads = SIZES[args.model]
    layers = args.layers or layers
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=hidden, num_hidden_layers=layers,
                                     num_attention_heads=heads, intermediate_size=4 * hidden,
                                     num_labels=2, attn_implementation="eager")
    model = transformers.BertForSequenceClassification(config).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.1)
    ids = torch.randint(config.vocab_size, (args.batch, args.seq))
    mask = torch.ones(args.batch, args.seq, dtype=torch.long)
    mask[0, args.seq // 2:] = 0  # a padded sequence exercises the attention mask
    types = torch.zeros(args.batch, args.seq, dtype=torch.long)
    types[:, args.seq // 3:] = 1
    with torch.no_grad():
        reference = model(input_ids=ids, attention_mask=mask, token_type_ids=types).logits

    state = {k: v for k, v in model.state_dict().items()
             if not k.endswith(("position_ids", "embeddings.token_type_ids"))}
    with tempfile.TemporaryDirectory(prefix="pswitch-bert-parity-") as workdir:
        weights = os.path.join(workdir, "weights.safetensors")
        inputs = os.path.join(workdir, "input.safetensors")
        outputs = os.path.join(workdir, "output.safetensors")
        safetensors_io.write(weights, state)
        safetensors_io.write(inputs, {"input": ids, "attention_mask": mask,
                                      "token_type_ids": types})
        command = [args.run_model, "--model", args.model, "--weights", weights, "--input", inputs,
                   "--output", outputs, "--device", args.device]
        if args.layers:
            command += ["--config", f"num_hidden_layers={layers}"]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            print(f"FAIL: run-model exited {result.returncode}\n{result.stderr}")
            return 1
        ours = safetensors_io.read(outputs)["output"]
    scale = reference.abs().max().item()
    diff = (ours - reference).abs().max().item()
    ok = ours.shape == reference.shape and diff <= 1e-4 * max(scale, 1e-12)
    print(f"{'PASS' if ok else 'FAIL'} {args.model} ({layers} layers) on {args.device}: "
          f"transformers {transformers.__version__}, max |diff| {diff:.3e}, scale {scale:.3e}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
