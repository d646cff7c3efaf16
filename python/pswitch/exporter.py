"""pswitch.export: turn your own PyTorch model into an archive pswitchd can switch and preempt.

    report = pswitch.export(model, example_input, "m.pswitch.pt",
                            loss=torch.nn.CrossEntropyLoss(), example_target=target)

The archive is the model itself as TorchScript (scripted, or traced when scripting fails), with
a call of `torch.ops.pswitch.gate(i)` before each leaf module (gates 1..N, in the order the
leaves first run; gate 0, the model itself, is pswitchd's: it calls it at the forward's entry,
the archive never does), and a layer table naming each gate's module. pswitchd turns each gate
into "wait until this layer's weights have arrived", so a switch can start computing on the
first layers while the rest are still in flight (docs/export.md has the format and which
models export).

How the gates get into the archive:
- scripting: each gated leaf gets an int attribute `_pswitch_gate` and a forward pre-hook
  `gate_hook(self, input: Tuple[...]) -> None` calling `torch.ops.pswitch.gate(self._pswitch_gate)`.
  TorchScript compiles pre-hooks from source and checks their annotation against the leaf's
  forward, so one hook per distinct forward signature is generated into a real module file.
  In the saved code the parent calls the hook, then the leaf's forward.
- tracing: plain Python pre-hooks call `torch.ops.pswitch.gate(i)`; the tracer records a
  `pswitch::gate(i)` node (i a constant) before the leaf's `prim::CallMethod`.
Both are removed from the user's model afterwards; its attributes, hooks, weights and training
flag are as they were.
"""
import dataclasses
import importlib.util
import inspect
import io
import json
import os
import re
import tempfile
import typing
import warnings

import torch
from torch import nn

from . import _ops

FORMAT = 1
LAYER_TABLE = "pswitch/layers.json"
# The inputs a model may take, in the order of its forward's arguments: the names clients send
# them under (the zoo's BERT takes the same).
INPUT_NAMES = ("input", "attention_mask", "token_type_ids")
LOSS_FILE = "pswitch/loss.pt"
_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
           torch.int64: "int64"}
# One precision per model: pswitchd feeds it inputs in its parameters' dtype.
_PRECISIONS = (torch.float32, torch.float16, torch.bfloat16)
_GATE_ATTRIBUTE = "_pswitch_gate"


@dataclasses.dataclass
class ExportReport:
    path: str
    method: str  # "script" or "trace"
    script_error: typing.Optional[str]  # why scripting failed, when it was tried and did
    gates: int  # gate ids 0..gates-1; 0 is the model itself
    layers: int  # gated leaf modules
    parameters: int  # distinct state_dict tensors (tied weights counted once)
    parameter_bytes: int
    has_loss: bool
    trace_warnings: typing.Tuple[str, ...] = ()  # the tracer's warnings, first line of each

    def __str__(self):
        how = "scripted" if self.method == "script" else "traced"
        text = (f"{self.path}: {how}, {self.gates} gates over {self.layers} leaf modules, "
                f"{self.parameters} tensors ({self.parameter_bytes / 2**20:.1f} MiB)"
                f"{', with loss' if self.has_loss else ''}")
        if self.script_error:
            text += f"\n  scripting failed: {self.script_error}"
        for warning in self.trace_warnings:
            text += f"\n  tracer warning: {warning}"
        return text


def _leaves(model):
    return [(name, m) for name, m in model.named_modules() if not list(m.children())]


def _owns_tensors(module):
    return (any(True for _ in module.parameters(recurse=False))
            or any(True for _ in module.buffers(recurse=False)))


def _gate_order(model, example):
    """Runs the model once. Returns its gate table (module path per gate id: the model first,
    then leaves by first call, then the leaves that own tensors but did not run), every leaf
    call of the pass as gate ids, and the output."""
    calls = []  # module paths, one per leaf call
    handles = []

    def record(name):
        def hook(module, args):
            calls.append(name)
        return hook

    leaves = [(name, m) for name, m in _leaves(model) if m is not model]
    for name, module in leaves:
        handles.append(module.register_forward_pre_hook(record(name)))
    try:
        with torch.no_grad():
            output = model(*example)
    finally:
        for h in handles:
            h.remove()
    order = list(dict.fromkeys(calls))
    ran = set(order)
    order += [name for name, module in leaves if name not in ran and _owns_tensors(module)]
    gates = [""] + order
    ids = {name: i for i, name in enumerate(gates)}
    return gates, [ids[name] for name in calls], output


_HOOK_TEMPLATE = '''
import torch
from typing import Dict, List, Optional, Tuple


def gate_hook(self, input: Tuple[{types}]) -> None:
    torch.ops.pswitch.gate(self.{attribute})
'''


class _HookFactory:
    """TorchScript compiles pre-hooks from source, annotated with the forward's argument types:
    one generated function per distinct signature, in a real module file under `directory`
    (which must outlive the torch.jit.script call)."""

    def __init__(self, directory):
        self._dir = directory
        self._hooks = {}

    def hook_for(self, module):
        forward = type(module).forward
        params = list(inspect.signature(forward).parameters.values())[1:]
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            raise TypeError(f"{type(module).__name__}.forward takes *args/**kwargs")
        hints = typing.get_type_hints(forward)
        types = ", ".join(_type_source(hints.get(p.name, torch.Tensor)) for p in params) or "()"
        if types not in self._hooks:
            name = f"_pswitch_hook_{len(self._hooks)}"
            path = os.path.join(self._dir, name + ".py")
            with open(path, "w") as f:
                f.write(_HOOK_TEMPLATE.format(types=types, attribute=_GATE_ATTRIBUTE))
            spec = importlib.util.spec_from_file_location(name, path)
            generated = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(generated)
            self._hooks[types] = generated.gate_hook
        return self._hooks[types]


def _type_source(hint):
    """The TorchScript annotation source of a forward argument's type hint."""
    if hint is torch.Tensor:
        return "torch.Tensor"
    if hint in (int, float, bool, str):
        return hint.__name__
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return f"Optional[{_type_source(rest[0])}]"
    elif origin is list and len(args) == 1:
        return f"List[{_type_source(args[0])}]"
    elif origin is tuple and args and Ellipsis not in args:
        return f"Tuple[{', '.join(_type_source(a) for a in args)}]"
    elif origin is dict and len(args) == 2:
        return f"Dict[{_type_source(args[0])}, {_type_source(args[1])}]"
    raise TypeError(f"cannot gate a leaf whose forward takes {hint!r}")


def _summarise_script_error(error):
    """The first line of a TorchScript error and where it points (the first `<--- HERE`)."""
    lines = [line.rstrip() for line in str(error).splitlines()]
    text = [line.strip().rstrip(":") for line in lines if line.strip()] or [repr(error)]
    first = text[0]
    if re.match(r"^[\w.]+\(.*\) -> ", first) and len(text) > 1:  # a schema: say what of it
        first = f"{first}: {text[1]}"
    if first.startswith("gate_hook("):
        first = ("a leaf is called without all of its forward's arguments, and TorchScript only "
                 f"hooks calls that pass them all ({first})")
    for i, line in enumerate(lines):
        if "<--- HERE" in line and i > 0:
            where = next((lines[j].strip() for j in range(i - 1, -1, -1)
                          if lines[j].strip().startswith('File "')), None)
            code = lines[i - 1].strip()
            return f"{first} ({where}: {code})" if where else f"{first} ({code})"
    return first


def _check_model(model, example):
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError("model is already TorchScript; pass the eager nn.Module (pswitch.export "
                        "scripts or traces it itself, adding the gates)")
    for name, p in model.named_parameters():
        if p.device.type != "cpu":
            raise ValueError(f"parameter '{name}' is on {p.device}; call model.float().cpu() "
                             "before pswitch.export (pswitchd moves the weights to the GPU "
                             "itself)")
        if p.dtype not in _PRECISIONS:
            raise TypeError(f"parameter '{name}' has dtype {p.dtype}; pswitch serves float32, "
                            "float16 and bfloat16 models: call model.float().cpu() (or .half(), "
                            ".bfloat16()) before pswitch.export")
    dtypes = {p.dtype for p in model.parameters()}
    if len(dtypes) > 1:
        raise TypeError(f"the model's parameters mix {sorted(str(d) for d in dtypes)}; pswitch "
                        "serves a model in one precision (convert it whole)")
    for name, b in model.named_buffers():
        if b.device.type != "cpu":
            raise ValueError(f"buffer '{name}' is on {b.device}; call model.float().cpu() "
                             "before pswitch.export")
    for name, tensor in zip(INPUT_NAMES, example):
        _check_tensor(f"the example's {name}", tensor)
        if tensor.dim() < 1 or tensor.shape[0] != example[0].shape[0]:
            raise ValueError(f"the example's {name} has shape {list(tensor.shape)}; every input "
                             "starts with the batch dimension, the same for all of them")


def _check_tensor(what, tensor):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} must be a tensor, not {type(tensor).__name__}")
    if tensor.dtype not in _DTYPES:
        raise TypeError(f"{what} has dtype {tensor.dtype}; pswitch takes float32, float16, "
                        "bfloat16 or int64 tensors")
    if tensor.device.type != "cpu":
        raise ValueError(f"{what} is on {tensor.device}; pass it on the CPU")


def _spec(tensor, high=None):
    entry = {"dtype": _DTYPES[tensor.dtype], "shape": list(tensor.shape)}
    if tensor.dtype == torch.int64:
        if high is None:
            high = int(tensor.max()) + 1 if tensor.numel() else 1
        entry["high"] = max(int(high), 1)
    return entry


def _first_tensor(output):
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"the model returned {type(output).__name__}; pswitch needs a tensor (or "
                    "a tuple/list starting with one)")


def _aliases(model):
    """state_dict keys that are the same tensor as an earlier key (tied weights)."""
    aliases, first = {}, {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in first:
            aliases[name] = first[id(tensor)]
        else:
            first[id(tensor)] = name
    return aliases


class _Loss(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, output, target):
        return self.fn(output, target)


def _export_loss(loss, example_output, example_target):
    """The loss as the bytes of a TorchScript archive of forward(output, target) -> scalar."""
    if isinstance(loss, nn.Module):
        module = loss
    elif callable(loss):
        module = _Loss(loss)
    else:
        raise TypeError(f"loss must be an nn.Module or a function (output, target) -> scalar, "
                        f"not {type(loss).__name__}")
    owned = [name for name, _ in module.named_parameters()]
    if owned:
        raise ValueError(f"the loss has parameters ({', '.join(owned[:4])}); pswitch trains the "
                         "model's parameters only (buffers, such as class weights, are fine)")
    output = example_output.detach()
    compiled = None
    if isinstance(loss, nn.Module):
        try:
            compiled = torch.jit.script(module)
        except Exception:  # noqa: BLE001 - fall back to tracing, as for the model
            compiled = None
    if compiled is None:
        try:
            compiled = torch.jit.trace(module, (output, example_target), check_trace=False)
        except Exception as error:
            raise RuntimeError(f"the loss can be neither scripted nor traced: "
                               f"{str(error).strip().splitlines()[0]}") from error
    probe = output.clone().requires_grad_()
    with torch.enable_grad():
        value = compiled(probe, example_target)
    if (not isinstance(value, torch.Tensor) or value.numel() != 1
            or not value.dtype.is_floating_point):
        what = (f"a {value.dtype} tensor of shape {list(value.shape)}"
                if isinstance(value, torch.Tensor) else type(value).__name__)
        raise ValueError(f"the loss must return a floating-point scalar tensor, not {what}")
    if not value.requires_grad:
        raise ValueError("the loss does not depend differentiably on the model's output "
                         "(nothing to train); check that it does not detach or call .item()")
    buffer = io.BytesIO()
    torch.jit.save(compiled, buffer)
    return buffer.getvalue()


def export(model, example_inputs, path, *, loss=None, example_target=None, method="auto",
           input_high=None, target_high=None):
    """Exports `model` to `path`. The model takes one float32 or int64 tensor, or (a tuple) up
    to three in the order of INPUT_NAMES: input, attention_mask, token_type_ids, which clients
    then send under those names (a mask left out is all ones, type ids zeros, where they have
    the input's shape).

    loss: an nn.Module or a function (output, target) -> scalar, for training in pswitchd;
    needs example_target. method: "auto" (script, else trace), "script" or "trace".
    input_high / target_high: exclusive bound of int64 inputs / targets pswitchd draws random
    examples from (default: the example's maximum + 1). Returns an ExportReport; raises
    TypeError / ValueError for models pswitch does not take and RuntimeError when neither
    scripting nor tracing gives an archive that computes what the model does.
    """
    if isinstance(example_inputs, dict):
        raise TypeError("pass the example inputs as a tuple in the order of the model's forward "
                        f"arguments, named {', '.join(INPUT_NAMES)} by pswitch; not a dict")
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    if not 1 <= len(example_inputs) <= len(INPUT_NAMES):
        raise ValueError(f"pswitch models take 1 to {len(INPUT_NAMES)} input tensors "
                         f"({', '.join(INPUT_NAMES)}); got {len(example_inputs)}")
    if method not in ("auto", "script", "trace"):
        raise ValueError(f"method must be 'auto', 'script' or 'trace', not {method!r}")
    if loss is not None and example_target is None:
        raise ValueError("a loss needs example_target (a target batch for the example input)")
    if example_target is not None:
        _check_tensor("example_target", example_target)
    example = tuple(example_inputs)
    _check_model(model, example)

    modes = [(m, m.training) for m in model.modules()]  # each one's: some may be frozen
    model.eval()
    try:
        gates, sequence, output = _gate_order(model, example)
        output = _first_tensor(output)
        if output.dtype not in _PRECISIONS:
            raise TypeError(f"the model's output has dtype {output.dtype}; pswitch needs float32, "
                            "float16 or bfloat16")
        archive, used, script_error, trace_warnings = _compile(model, example, gates, method)
        aliases = _aliases(model)
        layer_table = {
            "format": FORMAT,
            "exporter": "pswitch.export",
            "torch": torch.__version__,
            "method": used,
            "gates": gates,
            "inputs": [dict(name=name, **_spec(tensor, input_high if i == 0 else None))
                       for i, (name, tensor) in enumerate(zip(INPUT_NAMES, example))],
            "output": _spec(output),
            "target": _spec(example_target, target_high) if example_target is not None else None,
            "loss": loss is not None,
            "aliases": aliases,
        }
        extra = {LAYER_TABLE: json.dumps(layer_table)}
        if loss is not None:
            extra[LOSS_FILE] = _export_loss(loss, output, example_target)
        torch.jit.save(archive, path, _extra_files=extra)
        _verify(path, model, example, output, gates, sequence, aliases)
    finally:
        for module, training in modes:
            module.training = training
    unique = {id(t): t for t in model.state_dict(keep_vars=True).values()}
    return ExportReport(
        path=str(path), method=used, script_error=script_error, gates=len(gates),
        layers=len(gates) - 1, parameters=len(unique),
        parameter_bytes=sum(t.numel() * t.element_size() for t in unique.values()),
        has_loss=loss is not None, trace_warnings=trace_warnings)


def _compile(model, example, gates, method):
    """(TorchScript module, "script"|"trace", why scripting failed or None, tracer warnings)."""
    modules = dict(model.named_modules())
    script_error = None
    if method in ("auto", "script"):
        added = []
        with tempfile.TemporaryDirectory(prefix="pswitch-export-") as tmp:
            factory = _HookFactory(tmp)
            try:
                for gate, name in enumerate(gates[1:], start=1):
                    module = modules[name]
                    setattr(module, _GATE_ATTRIBUTE, gate)
                    added.append((module, module.register_forward_pre_hook(
                        factory.hook_for(module))))
                return torch.jit.script(model), "script", None, ()
            except Exception as error:  # noqa: BLE001 - reported, then traced
                script_error = _summarise_script_error(error)
                if method == "script":
                    raise RuntimeError(f"scripting failed: {error}") from error
            finally:
                _undo(added)

    added = []
    for gate, name in enumerate(gates[1:], start=1):
        module = modules[name]
        added.append((module, module.register_forward_pre_hook(
            lambda m, args, gate=gate: torch.ops.pswitch.gate(gate))))
    try:
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            archive = torch.jit.trace(model, example, check_trace=False)  # a tuple: the args
    except Exception as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise RuntimeError(
            ("the model can be neither scripted nor traced (scripting: "
             f"{script_error}); tracing: {reason}") if script_error
            else f"tracing failed: {reason}") from error
    finally:
        _undo(added)
    tracer = []
    for w in caught:
        if issubclass(w.category, torch.jit.TracerWarning):
            tracer.append(str(w.message).strip().splitlines()[0])
        else:  # not ours to swallow
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return archive, "trace", script_error, tuple(dict.fromkeys(tracer))


def _undo(added):
    for module, handle in added:
        handle.remove()
        if _GATE_ATTRIBUTE in module.__dict__:
            delattr(module, _GATE_ATTRIBUTE)
    added.clear()


def _names(gates, ids):
    return ", ".join(f"{g} '{gates[g]}'" if 0 <= g < len(gates) else str(g) for g in ids)


def _verify(path, model, example, expected, gates, sequence, aliases):
    """Loads the archive back: its gates run as the leaves did, it computes the model's output,
    and it holds the model's own tensors under the model's own names, tied ones still tied."""
    loaded = torch.jit.load(path)
    loaded.eval()
    records = _ops.records()
    with _ops.record_gates() as calls, torch.no_grad():
        got = _first_tensor(loaded(*example))
    if records and calls != sequence:
        at = next((i for i, (a, b) in enumerate(zip(calls, sequence)) if a != b),
                  min(len(calls), len(sequence)))
        raise RuntimeError(
            f"the exported archive calls its gates in another order than the model calls its "
            f"leaves: at call {at} the archive ran [{_names(gates, calls[at:at + 3])}], the model "
            f"[{_names(gates, sequence[at:at + 3])}] (please report this model)")
    if got.shape != expected.shape:
        raise RuntimeError(f"the exported archive's output has shape {list(got.shape)}, the "
                           f"model's {list(expected.shape)}, on the example input")
    if not torch.allclose(got, expected, rtol=1e-4, atol=1e-5):
        raise RuntimeError("the exported archive computes another output than the model on the "
                           f"example input (largest difference {(got - expected).abs().max():g})")

    def canonical(names):
        return {aliases.get(n, n) for n in names}

    held = canonical([n for n, _ in loaded.named_parameters()]
                     + [n for n, _ in loaded.named_buffers()])
    wanted = canonical([n for n, _ in model.named_parameters()]
                       + [n for n, _ in model.named_buffers()])
    if held != wanted:
        raise RuntimeError(
            f"the archive's tensors are not the model's: missing {sorted(wanted - held)[:4]}, "
            f"unexpected {sorted(held - wanted)[:4]}")
    mine = model.state_dict(keep_vars=True)
    theirs = loaded.state_dict(keep_vars=True)
    for name, tensor in mine.items():
        if name not in theirs or not torch.equal(theirs[name].detach(), tensor.detach()):
            raise RuntimeError(f"the archive's '{name}' is not the model's")
    for name, first in aliases.items():
        if theirs[name] is not theirs[first]:
            raise RuntimeError(f"'{name}' and '{first}' are one tensor in the model but two in "
                               "the archive")
