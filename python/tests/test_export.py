"""pswitch.export: gate order, scripting and tracing, tied weights, losses, refusals.

Pure Python (torch, no compiled binding): /usr/bin/python3 -m pytest python/tests/test_export.py
"""
import io
import json
import os
import sys
import zipfile
from typing import Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
# The package: the one on PYTHONPATH (ctest: the build tree's copy, with the binding), else this
# source tree's (the exporter needs no binding).
sys.path.append(os.path.dirname(HERE))
sys.path.insert(0, HERE)  # custom_models

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import pswitch  # noqa: E402  (the package imports neither the binding nor torch eagerly)
from pswitch import _ops  # noqa: E402
import custom_models  # noqa: E402


def extra(path, name):
    with zipfile.ZipFile(path) as z:
        member = next(n for n in z.namelist() if n.endswith("extra/" + name))
        return z.read(member)


def table(path):
    return json.loads(extra(path, "pswitch/layers.json"))


def no_hooks_left(model):
    for name, module in model.named_modules():
        assert not module._forward_pre_hooks, name
        assert not module._forward_hooks, name
        assert "_pswitch_gate" not in module.__dict__, name


def unchanged(model, before):
    """The user's model after export: same weights, no hooks or attributes left."""
    after = model.state_dict()
    assert list(after) == list(before)
    for name, tensor in after.items():
        assert torch.equal(tensor, before[name]), name
    no_hooks_left(model)


def gate_calls(path, x):
    loaded = torch.jit.load(path)
    with _ops.record_gates() as calls, torch.no_grad():
        out = loaded(x)
    return calls, out


def test_the_gate_operator_is_registered_and_records():
    assert _ops.records()
    with _ops.record_gates() as calls:
        torch.ops.pswitch.gate(3)
    assert calls == [3]
    import importlib
    importlib.reload(_ops)  # registering twice is a no-op, not an error
    torch.ops.pswitch.gate(4)


def test_gate_order_follows_execution_and_a_reused_module_has_one_gate(tmp_path):
    model = custom_models.make("residual_cnn", 0)
    model.train()  # export runs in eval mode and gives the flags back, each module its own
    model.stem[1].eval()  # a frozen BatchNorm
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = custom_models.example_input("residual_cnn", 2)
    path = str(tmp_path / "cnn.pt")
    report = pswitch.export(model, x, path)
    assert model.training and model.bn1.training and not model.stem[1].training
    unchanged(model, before)
    t = table(path)
    assert report.method == "script" and report.script_error is None and t["method"] == "script"
    assert t["format"] == 1 and t["exporter"] == "pswitch.export"
    assert t["torch"] == torch.__version__
    assert t["gates"] == ["", "stem.0", "stem.1", "stem.2", "conv1", "bn1", "relu", "conv2", "bn2",
                          "project.0", "project.1", "pool", "head"]
    assert report.gates == 13 and report.layers == 12
    assert t["inputs"] == [{"name": "input", "dtype": "float32", "shape": [2, 3, 32, 32]}]
    assert t["output"] == {"dtype": "float32", "shape": [2, 10]}
    assert t["loss"] is False and t["target"] is None and t["aliases"] == {}
    # In Python the gates run, in order (ReLU's twice; gate 0 is the server's), and do nothing.
    calls, out = gate_calls(path, x)
    assert calls == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 6, 11, 12]
    with torch.no_grad():
        torch.testing.assert_close(out, model.eval()(x), rtol=0, atol=0)


def test_traced_archives_gate_the_same_calls(tmp_path):
    model = custom_models.make("residual_cnn", 1)
    x = custom_models.example_input("residual_cnn", 1)
    path = str(tmp_path / "traced.pt")
    report = pswitch.export(model, x, path, method="trace")
    assert report.method == "trace" and report.script_error is None
    assert table(path)["method"] == "trace"
    calls, out = gate_calls(path, x)
    assert calls == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 6, 11, 12]
    # The gates are graph nodes with constant ids, before each leaf's call; none for gate 0.
    code = torch.jit.load(path).code
    assert "ops.pswitch.gate(4)" in code and "ops.pswitch.gate(0)" not in code
    no_hooks_left(model)


def test_tied_weights_stay_tied_in_the_archive(tmp_path):
    model = custom_models.make("tiny_transformer", 0)
    tokens = custom_models.example_input("tiny_transformer", 2)
    path = str(tmp_path / "tf.pt")
    report = pswitch.export(model, tokens, path, input_high=100)
    t = table(path)
    assert t["aliases"] == {"head.weight": "embed.weight"}
    assert t["inputs"] == [{"name": "input", "dtype": "int64", "shape": [2, 16], "high": 100}]
    assert t["output"] == {"dtype": "float32", "shape": [2, 16, 100]}
    # "pos" belongs to the model itself: no gate; every leaf that ran has one.
    assert "pos" not in t["gates"] and t["gates"][:2] == ["", "embed"] and t["gates"][-1] == "head"
    assert report.parameters == len({id(p) for p in model.state_dict(keep_vars=True).values()})
    loaded = torch.jit.load(path)
    # One tensor object in two slots: the same data, and an in-place change of one (values,
    # .data, set_) is a change of the other.
    assert loaded.head.weight is loaded.embed.weight
    assert loaded.head.weight.data_ptr() == loaded.embed.weight.data_ptr()
    with torch.no_grad():
        loaded.embed.weight.add_(1.0)
    assert torch.equal(loaded.head.weight, model.embed.weight + 1.0)
    loaded.embed.weight.data = torch.zeros_like(model.embed.weight)
    assert not loaded.head.weight.any()
    with torch.no_grad():
        loaded.head.weight.set_(torch.ones_like(model.embed.weight))
    assert loaded.embed.weight.eq(1).all()
    # Rebinding one slot to another tensor unties them.
    loaded.embed.weight = nn.Parameter(torch.full_like(model.embed.weight, 5.0))
    assert loaded.head.weight.eq(1).all()


def test_int64_high_defaults_to_the_examples_maximum_plus_one(tmp_path):
    model = custom_models.make("tiny_transformer", 0)
    tokens = torch.full((1, 16), 6, dtype=torch.int64)
    tokens[0, 3] = 41
    pswitch.export(model, tokens, str(tmp_path / "t.pt"))
    assert table(str(tmp_path / "t.pt"))["inputs"][0]["high"] == 42


def test_torchvision_resnet18(tmp_path):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 64, 64)
    path = str(tmp_path / "r18.pt")
    report = pswitch.export(model, x, path)
    assert report.method == "script"
    gates = table(path)["gates"]
    leaves = {n for n, m in model.named_modules() if not list(m.children())}
    assert gates[0] == "" and set(gates[1:]) == leaves and len(gates) == len(leaves) + 1
    assert gates[1:5] == ["conv1", "bn1", "relu", "maxpool"] and gates[-2:] == ["avgpool", "fc"]
    # The root ReLU runs once; each block's ReLU twice, under one gate.
    calls, out = gate_calls(path, x)
    assert calls.count(gates.index("relu")) == 1
    assert calls.count(gates.index("layer1.0.relu")) == 2
    assert sorted(set(calls)) == list(range(1, len(gates)))
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=0, atol=0)
    loaded = torch.jit.load(path)
    assert set(loaded.state_dict()) == set(model.state_dict())


def test_leaves_that_do_not_run_get_the_last_gates_if_they_own_tensors(tmp_path):
    class Partial(nn.Module):
        def __init__(self):
            super().__init__()
            self.aux = nn.Linear(4, 2)  # a training-only head: owns tensors, not run in eval
            self.fc = nn.Linear(4, 4)
            self.spare = nn.Tanh()  # neither runs nor owns anything: no gate
            self.act = nn.ReLU()
            self.register_buffer("mask", torch.ones(4), persistent=False)

        def forward(self, x):
            return self.act(self.fc(x)) * self.mask

    path = str(tmp_path / "p.pt")
    pswitch.export(Partial(), torch.randn(2, 4), path)
    assert table(path)["gates"] == ["", "fc", "act", "aux"]
    assert gate_calls(path, torch.randn(2, 4))[0] == [1, 2]


def test_a_model_script_cannot_compile_is_traced_and_says_why(tmp_path):
    class Unscriptable(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])

        def forward(self, x):
            return sum(layer(x) for layer in self.layers)  # a generator: not TorchScript

    model = Unscriptable()
    path = str(tmp_path / "u.pt")
    report = pswitch.export(model, torch.randn(3, 4), path)
    assert report.method == "trace"
    assert "sum(layer(x) for layer in self.layers)" in report.script_error  # where it failed
    assert "scripting failed" in str(report)
    assert table(path)["gates"] == ["", "layers.0", "layers.1"]
    assert gate_calls(path, torch.randn(3, 4))[0] == [1, 2]
    no_hooks_left(model)
    with pytest.raises(RuntimeError, match="scripting failed"):
        pswitch.export(model, torch.randn(3, 4), path, method="script")
    no_hooks_left(model)


def test_a_leaf_called_without_its_optional_arguments_is_traced(tmp_path):
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.full((4,), 2.0))

        def forward(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
            return x * self.w if bias is None else x * self.w + bias

    class Full(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = Scale()

        def forward(self, x):
            return self.scale(x, None)

    class Short(Full):
        def forward(self, x):
            return self.scale(x)

    report = pswitch.export(Full(), torch.randn(2, 4), str(tmp_path / "a.pt"))
    assert report.method == "script", report.script_error  # Optional[Tensor] in the hook
    report = pswitch.export(Short(), torch.randn(2, 4), str(tmp_path / "b.pt"))
    assert report.method == "trace" and "arguments" in report.script_error


def test_data_dependent_control_flow_is_traced_with_a_warning(tmp_path):
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            y = sum(v for v in [self.fc(x)])  # not scriptable
            return y * 2 if bool(y.sum() > 0) else y  # baked in by the tracer

    report = pswitch.export(Branchy(), torch.randn(2, 4), str(tmp_path / "b.pt"))
    assert report.method == "trace"
    assert any("Python boolean" in w for w in report.trace_warnings)
    assert "tracer warning" in str(report)


def test_a_model_neither_scripted_nor_traced_is_a_clear_error(tmp_path):
    class DictOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return {"out": [self.fc(x)]}

    with pytest.raises(TypeError, match="pswitch needs a tensor"):
        pswitch.export(DictOut(), torch.randn(1, 4), str(tmp_path / "n.pt"))

    class Neither(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            y = sum(v for v in [self.fc(x)])  # not scriptable
            return y, {"norm": float(y.norm())}  # a Python float in the output: not traceable

    model = Neither()
    with pytest.raises(RuntimeError, match=r"neither scripted nor traced \(scripting: .*tracing"):
        pswitch.export(model, torch.randn(1, 4), str(tmp_path / "n.pt"))
    no_hooks_left(model)  # a failed export leaves the model as it was, too
    assert not os.path.exists(tmp_path / "n.pt")


def test_the_check_catches_an_archive_that_computes_something_else(tmp_path):
    class Liar(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            if torch.jit.is_scripting():
                return self.fc(x) + 1.0
            return self.fc(x)

    with pytest.raises(RuntimeError, match="another output"):
        pswitch.export(Liar(), torch.randn(2, 4), str(tmp_path / "l.pt"))

    class Reorders(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.ReLU()
            self.b = nn.Identity()

        def forward(self, x):
            if torch.jit.is_scripting():
                return self.a(self.b(x))
            return self.b(self.a(x))  # the same output, the leaves in another order

    with pytest.raises(RuntimeError, match="another order"):
        pswitch.export(Reorders(), torch.randn(2, 4), str(tmp_path / "r.pt"))


def test_losses_module_and_function(tmp_path):
    model = custom_models.make("residual_cnn", 0)
    x = custom_models.example_input("residual_cnn", 2)
    target = torch.tensor([1, 7])
    with torch.no_grad():
        logits = model(x)
    weights = torch.linspace(0.5, 1.5, 10)
    for loss in (nn.CrossEntropyLoss(), nn.CrossEntropyLoss(weight=weights),
                 lambda out, t: nn.functional.cross_entropy(out, t, label_smoothing=0.1)):
        path = str(tmp_path / "l.pt")
        report = pswitch.export(model, x, path, loss=loss, example_target=target)
        t = table(path)
        assert report.has_loss and t["loss"] is True
        assert t["target"] == {"dtype": "int64", "shape": [2], "high": 8}
        # The stored loss is a TorchScript module computing the same value, differentiably.
        stored = torch.jit.load(io.BytesIO(extra(path, "pswitch/loss.pt")))
        out = logits.clone().requires_grad_()
        value = stored(out, target)
        torch.testing.assert_close(value, loss(logits, target))
        value.backward()
        assert out.grad is not None and out.grad.abs().sum() > 0
    no_hooks_left(model)


def test_bad_losses_are_refused(tmp_path):
    model = custom_models.make("residual_cnn", 0)
    x = custom_models.example_input("residual_cnn", 2)
    target = torch.tensor([1, 7])
    path = str(tmp_path / "l.pt")
    with pytest.raises(ValueError, match="example_target"):
        pswitch.export(model, x, path, loss=nn.CrossEntropyLoss())
    with pytest.raises(ValueError, match=r"loss has parameters \(weight, bias\)"):
        pswitch.export(model, x, path, loss=nn.Linear(10, 1), example_target=target)
    with pytest.raises(ValueError, match="scalar"):
        pswitch.export(model, x, path, loss=nn.CrossEntropyLoss(reduction="none"),
                       example_target=target)
    with pytest.raises(ValueError, match="does not depend differentiably"):
        pswitch.export(model, x, path, loss=lambda out, t: (out.detach() ** 2).mean(),
                       example_target=target)
    with pytest.raises(TypeError, match="example_target has dtype torch.int32"):
        pswitch.export(model, x, path, loss=nn.CrossEntropyLoss(),
                       example_target=target.to(torch.int32))


class IntOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x):
        return self.fc(x).argmax(-1)


def test_refusals_name_the_problem(tmp_path):
    path = str(tmp_path / "r.pt")
    double = nn.Sequential()
    double.add_module("fc", nn.Linear(2, 2))
    with pytest.raises(TypeError, match=r"parameter 'fc.weight' has dtype torch.float64.*"
                                        r"model.float\(\).cpu\(\)"):
        pswitch.export(double.double(), torch.randn(1, 2), path)
    with pytest.raises(ValueError, match="1 to 3 input tensors"):
        pswitch.export(nn.Linear(2, 2), (torch.randn(1, 2),) * 4, path)
    with pytest.raises(ValueError, match="attention_mask has shape \\[2, 2\\]; every input starts "
                                         "with the batch dimension"):
        pswitch.export(nn.Linear(2, 2), (torch.randn(1, 2), torch.ones(2, 2, dtype=torch.long)),
                       path)
    with pytest.raises(TypeError, match="not a dict"):
        pswitch.export(nn.Linear(2, 2), {"x": torch.randn(1, 2)}, path)
    with pytest.raises(TypeError, match="bfloat16 or int64"):
        pswitch.export(nn.Linear(2, 2), torch.randn(1, 2, dtype=torch.float64), path)
    with pytest.raises(ValueError, match="method"):
        pswitch.export(nn.Linear(2, 2), torch.randn(1, 2), path, method="onnx")
    with pytest.raises(TypeError, match="already TorchScript"):
        pswitch.export(torch.jit.script(nn.Linear(2, 2)), torch.randn(1, 2), path)
    with pytest.raises(TypeError, match="pswitch needs float32"):
        pswitch.export(IntOut(), torch.randn(1, 2), path)
    assert not os.path.exists(path)


def test_a_half_precision_model_exports_in_its_precision(tmp_path):
    # Issue 28 item 5: a model converted whole (model.bfloat16()) exports with its inputs and
    # output in that dtype; pswitchd serves it in half the bytes. Mixed precision is refused.
    path = str(tmp_path / "half.pt")
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).bfloat16().eval()
    pswitch.export(model, torch.randn(2, 4).bfloat16(), path)
    t = table(path)
    assert t["inputs"][0]["dtype"] == "bfloat16"
    assert t["output"]["dtype"] == "bfloat16"
    mixed = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    mixed[1].bfloat16()
    with pytest.raises(TypeError, match="one precision"):
        pswitch.export(mixed, torch.randn(2, 4), str(tmp_path / "mixed.pt"))


def test_a_one_tuple_input_and_a_tuple_output(tmp_path):
    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 5)
            self.b = nn.Linear(3, 2)

        def forward(self, x):
            return self.a(x), self.b(x)

    path = str(tmp_path / "t.pt")
    report = pswitch.export(TwoHeads(), (torch.randn(4, 3),), path)
    assert report.method == "script"
    assert table(path)["output"] == {"dtype": "float32", "shape": [4, 5]}
