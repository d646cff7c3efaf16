"""pswitch.export: gate order, scripting and tracing, tied weights, losses, refusals."""
import json
import zipfile

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import pswitch  # noqa: E402
from pswitch import _ops  # noqa: E402
import custom_models  # noqa: E402


def table(path):
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("extra/pswitch/layers.json"))
        return json.loads(z.read(name))


def unchanged(model, before):
    """The user's model after export: same weights, no hooks or attributes left."""
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    for module in model.modules():
        assert not module._forward_pre_hooks
        assert not hasattr(module, "_pswitch_gate")


def test_gate_order_follows_execution_and_a_reused_module_has_one_gate(tmp_path):
    model = custom_models.make("residual_cnn", 0)
    model.train()  # export runs in eval mode and gives the flag back
    before = {k: v.clone() for k, v in model.state_dict().items()}
    path = str(tmp_path / "cnn.pt")
    report = pswitch.export(model, custom_models.example_input("residual_cnn", 2), path)
    assert model.training
    unchanged(model, before)
    t = table(path)
    assert report.method == "script" and report.script_error is None and t["method"] == "script"
    assert t["gates"] == ["", "stem.0", "stem.1", "stem.2", "conv1", "bn1", "relu", "conv2", "bn2",
                          "project.0", "project.1", "pool", "head"]
    assert t["inputs"] == [{"name": "input", "dtype": "float32", "shape": [2, 3, 32, 32]}]
    assert t["output"] == {"dtype": "float32", "shape": [2, 10]}
    assert t["loss"] is False and t["target"] is None
    # In Python the gates run, in order (ReLU's twice), and do nothing.
    loaded = torch.jit.load(path)
    with _ops.record_gates() as calls, torch.no_grad():
        out = loaded(custom_models.example_input("residual_cnn", 2))
    assert calls == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 6, 11, 12]
    with torch.no_grad():
        torch.testing.assert_close(out, model.eval()(custom_models.example_input("residual_cnn", 2)))


def test_tied_weights_stay_tied_in_the_archive(tmp_path):
    model = custom_models.make("tiny_transformer", 0)
    path = str(tmp_path / "tf.pt")
    report = pswitch.export(model, custom_models.example_input("tiny_transformer", 2), path)
    t = table(path)
    assert t["aliases"] == {"head.weight": "embed.weight"}
    assert t["inputs"][0]["dtype"] == "int64" and t["inputs"][0]["high"] >= 1
    assert report.parameters == len({id(p) for p in model.state_dict(keep_vars=True).values()})
    loaded = torch.jit.load(path)
    assert loaded.head.weight.data_ptr() == loaded.embed.weight.data_ptr()


def test_a_model_script_cannot_compile_is_traced_and_says_why(tmp_path):
    class Unscriptable(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])

        def forward(self, x):
            return sum(layer(x) for layer in self.layers)  # a generator: not TorchScript

    path = str(tmp_path / "u.pt")
    report = pswitch.export(Unscriptable(), torch.randn(3, 4), path)
    assert report.method == "trace" and report.script_error
    assert table(path)["gates"] == ["", "layers.0", "layers.1"]
    with pytest.raises(RuntimeError, match="scripting failed"):
        pswitch.export(Unscriptable(), torch.randn(3, 4), path, method="script")


def test_a_model_neither_scripted_nor_traced_is_a_clear_error(tmp_path):
    class Neither(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return {"out": [self.fc(x)]}  # a dict of lists: neither scripts as used nor traces

    with pytest.raises(TypeError, match="pswitch needs a tensor"):
        pswitch.export(Neither(), torch.randn(1, 4), str(tmp_path / "n.pt"))


def test_losses_module_and_function(tmp_path):
    model = custom_models.make("residual_cnn", 0)
    x = custom_models.example_input("residual_cnn", 2)
    target = torch.tensor([1, 7])
    for loss in (nn.CrossEntropyLoss(), lambda out, t: nn.functional.cross_entropy(out, t)):
        path = str(tmp_path / "l.pt")
        report = pswitch.export(model, x, path, loss=loss, example_target=target)
        t = table(path)
        assert report.has_loss and t["loss"] is True
        assert t["target"] == {"dtype": "int64", "shape": [2], "high": 8}
        with zipfile.ZipFile(path) as z:
            assert any(n.endswith("extra/pswitch/loss.pt") for n in z.namelist())
    with pytest.raises(ValueError, match="example_target"):
        pswitch.export(model, x, str(tmp_path / "l.pt"), loss=nn.CrossEntropyLoss())
    with pytest.raises(ValueError, match="loss has parameters"):
        pswitch.export(model, x, str(tmp_path / "l.pt"), loss=nn.Linear(10, 1),
                       example_target=target)


def test_refusals_name_the_problem(tmp_path):
    path = str(tmp_path / "r.pt")
    double = nn.Sequential()
    double.add_module("fc", nn.Linear(2, 2))
    with pytest.raises(TypeError, match="parameter 'fc.weight' has dtype torch.float64"):
        pswitch.export(double.double(), torch.randn(1, 2), path)
    with pytest.raises(ValueError, match="one input tensor"):
        pswitch.export(nn.Linear(2, 2), (torch.randn(1, 2), torch.randn(1, 2)), path)
    with pytest.raises(TypeError, match="float32 or int64"):
        pswitch.export(nn.Linear(2, 2), torch.randn(1, 2, dtype=torch.float64), path)
    with pytest.raises(ValueError, match="method"):
        pswitch.export(nn.Linear(2, 2), torch.randn(1, 2), path, method="onnx")
