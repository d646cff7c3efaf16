"""The gate operator, `torch.ops.pswitch.gate(int layer) -> ()`, as plain PyTorch sees it.

pswitch.export puts a call of it before each leaf module of a model; in pswitchd the operator
is the worker's wait for the layer's group of weights (models/script_model.cc registers the C++
side). In Python it does nothing, except tell the exporter's checks which gates ran.

Importing this module twice, or after something else (a second copy of the package, a C++
library) registered the operator, registers nothing: the first registration stands.
"""
import torch

_recorders = globals().get("_recorders", [])  # lists the exporter's checks append gate ids to


def _gate(layer):
    for calls in _recorders:
        calls.append(int(layer))


def _registered():
    try:
        torch.ops.pswitch.gate
        return True
    except (AttributeError, RuntimeError):
        return False


# Kept alive for the process, across importlib.reload too: dropping the Library would
# unregister the operator under archives still calling it.
_library = globals().get("_library")
if _library is None and not _registered():
    _library = torch.library.Library("pswitch", "DEF")
    # CONSERVATIVE: the call has effects TorchScript cannot see, so dead-code elimination and
    # reordering passes leave it where it is.
    _library.define("gate(int layer) -> ()", alias_analysis="CONSERVATIVE")
    _library.impl("gate", _gate, "CompositeExplicitAutograd")


class record_gates:
    """Context manager collecting the ids of the gates that run inside it (in this module's
    implementation; see `records()`)."""

    def __enter__(self):
        self.calls = []
        _recorders.append(self.calls)
        return self.calls

    def __exit__(self, *exc):
        _recorders.remove(self.calls)
        return False


def records():
    """Whether record_gates sees gate calls: False when the operator that is registered is not
    this module's (registered first by another copy of pswitch or by C++)."""
    with record_gates() as calls:
        torch.ops.pswitch.gate(0)
    return calls == [0]
