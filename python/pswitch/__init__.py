"""pswitch: millisecond model switching and pipeline-bubble filling on a shared GPU.

    import pswitch
    with pswitch.Client("127.0.0.1:7300") as client:
        client.register("resnet18", "resnet18")
        logits = client.infer("resnet18", images)      # numpy array or torch tensor

Your own model: pswitch.export(model, example_input, "m.pswitch.pt") (needs torch), then a
model repository folder whose config.json names the archive (docs/export.md).

The client needs the compiled module pswitch._pswitch and numpy; the exporter needs torch. Each
is imported on first use, so either works without the other.
"""
from . import errors
from .errors import PswitchError

_CLIENT_NAMES = ("Client", "FillJobStatus", "FillStats", "ModelInfo", "RegisteredModel",
                 "TaskResult", "TaskStatus")


def export(model, example_inputs, path, **options):
    """Exports your own model for pswitchd (pswitch.exporter.export; imports torch)."""
    from .exporter import export as _export
    return _export(model, example_inputs, path, **options)


def __getattr__(name):
    if name in _CLIENT_NAMES:
        from . import client
        return getattr(client, name)
    if name == "BubbleReporter":
        from .pipeline import BubbleReporter
        return BubbleReporter
    raise AttributeError(f"module 'pswitch' has no attribute '{name}'")


__all__ = ["BubbleReporter", "PswitchError", "errors", "export", *_CLIENT_NAMES]
