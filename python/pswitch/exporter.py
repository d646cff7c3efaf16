"""pswitch.export: turn your own PyTorch model into an archive pswitchd can switch and preempt.

    report = pswitch.export(model, example_input, "m.pswitch.pt",
                            loss=torch.nn.CrossEntropyLoss(), example_target=target)

The archive is the model itself as TorchScript (scripted, or traced when scripting fails), with
a call of `torch.ops.pswitch.gate(i)` before each leaf module (gates 1..N, in the order the
leaves first run; gate 0, the model itself, is pswitchd's, at the forward's entry), and a layer table naming each gate's
module. pswitchd turns each gate into "wait until this layer's weights have arrived", so a
switch can start computing on the first layers while the rest are still in flight
(docs/export.md has the format and which models export).
"""
import dataclasses
import importlib.util
import io
import json
import os
import tempfile
import typing

import torch
from torch import nn

from . import _ops

FORMAT = 1
LAYER_TABLE = "pswitch/layers.json"
LOSS_FILE = "pswitch/loss.pt"
_DTYPES = {torch.float32: "float32", torch.int64: "int64"}


@dataclasses.dataclass
class ExportReport:
    path: str
    method: str  # "script" or "trace"
    script_error: typing.Optional[str]  # why scripting failed, when it was tried and did
    gates: int
    layers: int  # gated leaf modules
    parameters: int
    parameter_bytes: int
    has_loss: bool

    def __str__(self):
        how = "scripted" if self.method == "script" else "traced"
        text = (f"{self.path}: {how}, {self.gates} gates over {self.layers} leaf modules, "
                f"{self.parameters} tensors ({self.parameter_bytes / 2**20:.1f} MiB)"
                f"{', with loss' if self.has_loss else ''}")
        if self.script_error:
            text += f"\n  scripting failed: {self.script_error}"
        return text


def _leaves(model):
    return [(name, m) for name, m in model.named_modules() if not list(m.children())]


def _gate_order(model, example):
    """Gate id per module path: the model first, then leaves by first call, then the leaves
    that own tensors but did not run."""
    order = []
    seen = set()
    handles = []

    def record(name):
        def hook(module, args):
            if name not in seen:
                seen.add(name)
                order.append(name)
        return hook

    leaves = _leaves(model)
    for name, module in leaves:
        if module is not model:
            handles.append(module.register_forward_pre_hook(record(name)))
    try:
        with torch.no_grad():
            output = model(example)
    finally:
        for h in handles:
            h.remove()
    for name, module in leaves:
        owns = any(True for _ in module.parameters(recurse=False)) or any(
            True for _ in module.buffers(recurse=False))
        if name not in seen and owns and module is not model:
            order.append(name)
    return [""] + order, output


_HOOK_TEMPLATE = '''
import torch
from typing import Optional, Tuple


def gate_hook(self, input: Tuple[{types}]) -> None:
    torch.ops.pswitch.gate(self._pswitch_gate)
'''


class _HookFactory:
    """TorchScript compiles pre-hooks from source, annotated with the forward's argument types:
    one generated function per distinct signature, in a real module file."""

    def __init__(self, directory):
        self._dir = directory
        self._hooks = {}

    def hook_for(self, module):
        forward = type(module).forward
        hints = typing.get_type_hints(forward) if hasattr(forward, "__annotations__") else {}
        import inspect
        params = list(inspect.signature(forward).parameters.values())[1:]
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            raise TypeError(f"{type(module).__name__}.forward takes *args/**kwargs")
        types = []
        for p in params:
            hint = hints.get(p.name, torch.Tensor)
            types.append(_type_source(hint))
        key = ", ".join(types) if types else "()"
        if key not in self._hooks:
            path = os.path.join(self._dir, f"_pswitch_hook_{len(self._hooks)}.py")
            with open(path, "w") as f:
                f.write(_HOOK_TEMPLATE.format(types=", ".join(types) if types else "()"))
            spec = importlib.util.spec_from_file_location(f"_pswitch_hook_{len(self._hooks)}",
                                                          path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            self._hooks[key] = mod.gate_hook
        return self._hooks[key]


def _type_source(hint):
    if hint is torch.Tensor:
        return "torch.Tensor"
    if hint in (int, float, bool, str):
        return hint.__name__
    origin = typing.get_origin(hint)
    if origin is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return f"Optional[{_type_source(args[0])}]"
    raise TypeError(f"cannot gate a leaf whose forward takes {hint!r}")


def _check_model(model, example):
    for name, p in model.named_parameters():
        if p.device.type != "cpu":
            raise ValueError(f"parameter '{name}' is on {p.device}; call model.cpu() before "
                             "pswitch.export (pswitchd moves the weights to the GPU itself)")
        if p.dtype != torch.float32:
            raise TypeError(f"parameter '{name}' has dtype {p.dtype}; pswitch serves float32 "
                            "models: call model.float() before pswitch.export")
    for name, b in model.named_buffers():
        if b.device.type != "cpu":
            raise ValueError(f"buffer '{name}' is on {b.device}; call model.cpu() first")
    if example.dtype not in _DTYPES:
        raise TypeError(f"the example input has dtype {example.dtype}; pswitch takes float32 "
                        "or int64 inputs")
    if example.device.type != "cpu":
        raise ValueError("the example input must be on the CPU")


def _spec(tensor, high=None):
    entry = {"dtype": _DTYPES[tensor.dtype], "shape": list(tensor.shape)}
    if tensor.dtype == torch.int64:
        entry["high"] = int(high) if high is not None else max(int(tensor.max()) + 1, 1)
    return entry


def _first_tensor(output):
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"the model returned {type(output).__name__}; pswitch needs a tensor (or "
                    "a tuple/list starting with one)")


class _Loss(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, output, target):
        return self.fn(output, target)


def _export_loss(loss, example_output, example_target):
    module = loss if isinstance(loss, nn.Module) else _Loss(loss)
    if any(True for _ in module.parameters()):
        raise ValueError("the loss has parameters; pswitch trains the model's parameters only")
    scripted = None
    if isinstance(loss, nn.Module):
        try:
            scripted = torch.jit.script(module)
        except Exception:  # noqa: BLE001 - fall back to tracing, as for the model
            scripted = None
    if scripted is None:
        scripted = torch.jit.trace(module, (example_output.detach(), example_target))
    value = scripted(example_output.detach(), example_target)
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        raise ValueError("the loss must return a scalar tensor")
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    return buffer.getvalue()


def export(model, example_inputs, path, *, loss=None, example_target=None, method="auto",
           input_high=None, target_high=None):
    """Exports `model` (an nn.Module taking one float32 or int64 tensor) to `path`.

    loss: an nn.Module or a function (output, target) -> scalar, for training in pswitchd;
    needs example_target. method: "auto" (script, else trace), "script" or "trace".
    input_high / target_high: exclusive bound of int64 inputs / targets pswitchd draws random
    examples from (default: the example's maximum + 1). Returns an ExportReport.
    """
    if isinstance(example_inputs, (tuple, list)):
        if len(example_inputs) != 1:
            raise ValueError(f"pswitch models take one input tensor; got {len(example_inputs)}")
        example_inputs = example_inputs[0]
    if not isinstance(example_inputs, torch.Tensor):
        raise TypeError("example_inputs must be a tensor (or a 1-tuple of one)")
    if method not in ("auto", "script", "trace"):
        raise ValueError(f"method must be 'auto', 'script' or 'trace', not {method!r}")
    if loss is not None and example_target is None:
        raise ValueError("a loss needs example_target")
    example = example_inputs
    _check_model(model, example)

    was_training = model.training
    model.eval()
    added = []  # (module, handle) to undo
    try:
        gates, output = _gate_order(model, example)
        output = _first_tensor(output)
        if output.dtype != torch.float32:
            raise TypeError(f"the model's output has dtype {output.dtype}; pswitch needs float32")
        modules = dict(model.named_modules())
        script_error = None
        archive = None
        with tempfile.TemporaryDirectory(prefix="pswitch-export-") as tmp:
            if method in ("auto", "script"):
                factory = _HookFactory(tmp)
                try:
                    for gate, name in enumerate(gates[1:], start=1):
                        module = modules[name]
                        module._pswitch_gate = gate
                        added.append((module, module.register_forward_pre_hook(
                            factory.hook_for(module))))
                    archive = torch.jit.script(model)
                    used = "script"
                except Exception as error:  # noqa: BLE001 - reported, then traced
                    script_error = str(error).strip().splitlines()[0] if str(error) else repr(error)
                    if method == "script":
                        raise RuntimeError(f"scripting failed: {error}") from error
                finally:
                    _undo(added)
            if archive is None:
                for gate, name in enumerate(gates[1:], start=1):
                    module = modules[name]
                    added.append((module, module.register_forward_pre_hook(
                        lambda m, args, gate=gate: torch.ops.pswitch.gate(gate))))
                try:
                    with torch.no_grad():
                        archive = torch.jit.trace(model, example, check_trace=False)
                except Exception as error:
                    raise RuntimeError(
                        "the model can be neither scripted nor traced"
                        + (f" (scripting: {script_error})" if script_error else "")
                        + f"; tracing: {str(error).strip().splitlines()[0]}") from error
                finally:
                    _undo(added)
                used = "trace"

        aliases = {}
        first = {}
        for name, tensor in list(model.state_dict(keep_vars=True).items()):
            key = id(tensor)
            if key in first:
                aliases[name] = first[key]
            else:
                first[key] = name
        layer_table = {
            "format": FORMAT,
            "exporter": "pswitch.export",
            "torch": torch.__version__,
            "method": used,
            "gates": gates,
            "inputs": [dict(name="input", **_spec(example, input_high))],
            "output": _spec(output),
            "target": _spec(example_target, target_high) if example_target is not None else None,
            "loss": loss is not None,
            "aliases": aliases,
        }
        extra = {LAYER_TABLE: json.dumps(layer_table)}
        if loss is not None:
            extra[LOSS_FILE] = _export_loss(loss, output, example_target)
        torch.jit.save(archive, path, _extra_files=extra)
        _verify(path, model, example, output, len(gates))
    finally:
        model.train(was_training)
    unique = {id(t): t for t in model.state_dict(keep_vars=True).values()}
    return ExportReport(
        path=path, method=used, script_error=script_error, gates=len(gates),
        layers=len(gates) - 1, parameters=len(unique),
        parameter_bytes=sum(t.numel() * t.element_size() for t in unique.values()),
        has_loss=loss is not None)


def _undo(added):
    for module, handle in added:
        handle.remove()
        if hasattr(module, "_pswitch_gate"):
            del module._pswitch_gate
    added.clear()


def _verify(path, model, example, expected, gates):
    loaded = torch.jit.load(path)
    loaded.eval()
    with _ops.record_gates() as calls, torch.no_grad():
        got = _first_tensor(loaded(example))
    if (gates > 1 and not calls) or any(c < 1 or c >= gates for c in calls):
        raise RuntimeError(f"the exported archive's gates ran as {calls[:8]}...; expected gates "
                           f"1..{gates - 1} (please report this model)")
    if got.shape != expected.shape or not torch.allclose(got, expected, rtol=1e-4, atol=1e-5):
        raise RuntimeError("the exported archive computes another output than the model on the "
                           "example input")
    names = {n for n, _ in loaded.named_parameters()} | {n for n, _ in loaded.named_buffers()}
    wanted = set(model.state_dict().keys())
    if not names <= wanted:
        raise RuntimeError(f"the archive's tensors {sorted(names - wanted)[:4]} are not the "
                           "model's state_dict keys")
