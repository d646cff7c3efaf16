"""A model pswitch has never seen, from a Python session to pipelined, preemptible serving."""
import json
import os
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import pswitch  # noqa: E402
from pswitch import errors  # noqa: E402
import custom_models  # noqa: E402
from conftest import Daemon  # noqa: E402


class Scorer(nn.Module):
    """Written here, in no zoo: a gated MLP with LayerNorm and a skip connection."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(12, 32)
        self.norm = nn.LayerNorm(32)
        self.gate = nn.Linear(32, 32)
        self.act = nn.SiLU()
        self.out = nn.Linear(32, 5)

    def forward(self, x):
        h = self.norm(self.inp(x))
        return self.out(h + self.act(self.gate(h)) * h)


def test_export_register_infer_train_and_preempt(client, tmp_path):
    torch.manual_seed(0)
    model = Scorer().eval()
    x = torch.randn(4, 12)
    path = str(tmp_path / "scorer.pswitch.pt")
    report = pswitch.export(model, x, path, loss=nn.CrossEntropyLoss(),
                            example_target=torch.tensor([0, 1, 2, 4]))
    assert report.method == "script"
    registered = client.register("scorer", archive=path, batch=4)
    assert registered.layers == 6  # the model itself and its five leaves
    assert {m.name: m.architecture for m in client.models()}["scorer"] == "torchscript"
    with torch.no_grad():
        expected = model(x)
    got = client.infer("scorer", x)
    assert isinstance(got, torch.Tensor)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    # Switching between it and a zoo model: the answer stays exact.
    for _ in range(3):
        client.infer("tiny_mlp", np.zeros((1, 64), dtype=np.float32))
        torch.testing.assert_close(client.infer("scorer", x), expected, rtol=1e-5, atol=1e-6)

    # Training on the server, preempted by inference, ends where an uninterrupted run does.
    client.register("scorer_b", archive=path, batch=4)
    straight = client.train("scorer_b", 300, seed=3, optimizer="adam", lr=1e-3, momentum=0)
    result = {}
    worker = threading.Thread(target=lambda: result.update(
        r=client.train("scorer", 300, seed=3, optimizer="adam", lr=1e-3, momentum=0)))
    worker.start()
    while worker.is_alive():
        client.infer("tiny_mlp", np.zeros((1, 64), dtype=np.float32))
    worker.join()
    status = client.status(result["r"].task_id)
    assert status.state == "succeeded" and status.iterations_done == 300
    assert status.preemptions >= 1
    assert client.status(straight.task_id).preemptions == 0
    a, b = client.infer("scorer", x), client.infer("scorer_b", x)
    assert torch.equal(a, b)  # bit for bit
    assert not torch.allclose(a, expected)  # and training moved the weights


def test_a_bert_shaped_model_takes_its_attention_mask_and_token_types(client, tmp_path):
    # Inputs named as the protocol names them (the zoo's BERT takes the same), in the order of
    # the model's forward arguments.
    model = custom_models.make("masked_classifier", seed=4)
    tokens, mask, types = custom_models.example_inputs("masked_classifier", batch=3, seed=5)
    path = str(tmp_path / "classifier.pswitch.pt")
    report = pswitch.export(model, (tokens, mask, types), path, loss=nn.CrossEntropyLoss(),
                            example_target=torch.tensor([0, 2, 1]))
    assert report.method == "script"
    client.register("classifier", archive=path, batch=2)
    with torch.no_grad():
        expected = model(tokens, mask, types)
        defaults = model(tokens, torch.ones_like(tokens), torch.zeros_like(tokens))
    assert not torch.allclose(expected, defaults)  # the mask and the segments matter
    got = client.infer("classifier", {"input": tokens, "attention_mask": mask,
                                      "token_type_ids": types.numpy().astype(np.int32)})
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    # Left out: a mask of ones, segment 0.
    torch.testing.assert_close(client.infer("classifier", tokens), defaults, rtol=1e-5, atol=1e-6)
    with pytest.raises(errors.InvalidArgumentError, match="attention_mask"):
        client.infer("classifier", {"input": tokens, "attention_mask": mask[:, :4].reshape(-1)})
    trained = client.train("classifier", 5, seed=1)
    assert client.status(trained.task_id).state == "succeeded"


def test_bad_archives_are_refused_clearly(client, tmp_path):
    plain = str(tmp_path / "plain.pt")
    torch.jit.save(torch.jit.script(Scorer()), plain)
    with pytest.raises(errors.InvalidArgumentError, match="has no layer table"):
        client.register("plain", archive=plain)
    with pytest.raises(errors.PermissionDeniedError):
        client.register("missing", archive=str(tmp_path / "missing.pt"))
    with pytest.raises(errors.InvalidArgumentError, match="absolute"):
        client.register("relative", archive="scorer.pt")
    assert "plain" not in {m.name for m in client.models()}
    # Exported without a loss: it serves, and training is refused up front, saying why.
    path = str(tmp_path / "noloss.pt")
    pswitch.export(Scorer(), torch.randn(2, 12), path)
    client.register("noloss", archive=path)
    assert client.infer("noloss", torch.randn(2, 12)).shape == (2, 5)
    with pytest.raises(errors.FailedPreconditionError, match="without a loss"):
        client.train("noloss", 1)
    with pytest.raises(errors.FailedPreconditionError, match="without a loss"):
        client.submit_fill("training", "noloss", steps=1, step=0.001, memory_bytes=1 << 20)


def test_the_model_repository_serves_an_exported_model(tmp_path):
    repo = tmp_path / "models"
    (repo / "tf").mkdir(parents=True)
    model = custom_models.make("tiny_transformer", 5)
    tokens = custom_models.example_input("tiny_transformer", 2, 6)
    pswitch.export(model, tokens, str(repo / "tf" / "model.pswitch.pt"))
    (repo / "tf" / "config.json").write_text(json.dumps({"archive": "model.pswitch.pt",
                                                         "batch": 2}))
    d = Daemon("--preload=", f"--model-repository={repo}", "--allow-client-paths=false")
    try:
        with pswitch.Client(d.address, timeout=60) as c:
            from conftest import wait_for
            wait_for(lambda: "tf" in {m.name for m in c.models()}, what="the repository model")
            with torch.no_grad():
                expected = model(tokens)
            torch.testing.assert_close(c.infer("tf", tokens), expected, rtol=1e-5, atol=1e-5)
            # int32 token ids, as torch's embedding takes them, give the same answer.
            torch.testing.assert_close(c.infer("tf", tokens.to(torch.int32)), expected,
                                       rtol=1e-5, atol=1e-5)
    finally:
        d.stop()
