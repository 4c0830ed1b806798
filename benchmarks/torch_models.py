"""Real exports for benchmarks/real_models.py: torchvision and Hugging Face models with random weights at their
real sizes, exported by torch.onnx (TorchScript exporter, opset 17), each as (onnx model, feeds).

- MobileNetV3-small and EfficientNet-B0 (torchvision, 1x3x224x224): depthwise and squeeze-excite CNNs;
  BatchNorm statistics drawn at random (both exporters fold BatchNorm into the convs);
- a GPT-2 decoding step (transformers' GPT2Model at GPT-2 small's size: 12 layers, d 768, 12 heads, vocab
  50257): one new token with a 127-token KV cache, batch 1, as generation runs it;
- a 2-layer LSTM (torch.nn.LSTM, input 128, hidden 256, batch 8, 64 steps).

Exports take a few seconds each (torch is imported only here); ImportError when torch is missing.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx

SEED = 0


def _export(module, args: tuple, names: list[str], outputs: list[str]) -> onnx.ModelProto:
    import torch
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, buf, dynamo=False, opset_version=17, input_names=names,
                          output_names=outputs)
    return onnx.load_from_string(buf.getvalue())


def _feeds(args: tuple, names: list[str]) -> dict:
    return {n: a.numpy() for n, a in zip(names, args)}


def torchvision_cnn(name: str) -> tuple[onnx.ModelProto, dict]:
    import torch
    import torchvision
    torch.manual_seed(SEED)
    model = getattr(torchvision.models, name)(weights=None)
    for m in model.modules():  # trained-looking BatchNorm statistics, so the folds carry real values
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    args = (torch.randn(1, 3, 224, 224),)
    return _export(model.eval(), args, ["x"], ["y"]), _feeds(args, ["x"])


def gpt2_step(layers: int = 12, dim: int = 768, heads: int = 12, past: int = 127) -> tuple[onnx.ModelProto, dict]:
    import torch
    import transformers as T
    torch.manual_seed(SEED)
    cfg = T.GPT2Config(n_embd=dim, n_layer=layers, n_head=heads, n_positions=1024)
    model = T.GPT2Model(cfg).eval()
    kv = [f"past_{w}{i}" for i in range(layers) for w in ("key", "value")]

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, ids, mask, *flat):
            cache = T.DynamicCache(ddp_cache_data=[(flat[2 * i], flat[2 * i + 1]) for i in range(layers)],
                                   config=cfg)
            out = self.m(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
            return (out.last_hidden_state, *(t for layer in out.cache.layers for t in (layer.keys, layer.values)))

    args = (torch.randint(0, cfg.vocab_size, (1, 1)), torch.ones(1, past + 1, dtype=torch.long),
            *(torch.randn(1, heads, past, dim // heads) for _ in kv))
    names = ["ids", "mask", *kv]
    outputs = ["y", *(f"present_{w}{i}" for i in range(layers) for w in ("key", "value"))]
    return _export(Step(), args, names, outputs), _feeds(args, names)


def lstm(batch: int = 8, steps: int = 64, kind: str = "LSTM") -> tuple[onnx.ModelProto, dict]:
    """A 2-layer 256-hidden torch.nn.LSTM (or kind "GRU": nn.GRU) over 128 features, then a linear head."""
    import torch
    torch.manual_seed(SEED)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = getattr(torch.nn, kind)(128, 256, num_layers=2, batch_first=True)
            self.head = torch.nn.Linear(256, 16)

        def forward(self, x):
            return self.head(self.rnn(x)[0])

    args = (torch.randn(batch, steps, 128),)
    return _export(Net().eval(), args, ["x"], ["y"]), _feeds(args, ["x"])


if __name__ == "__main__":  # a quick check that every export runs here
    for model, feeds in (torchvision_cnn("mobilenet_v3_small"), gpt2_step(2, 64, 4, 7), lstm(2, 5), lstm(2, 5, "GRU")):
        print(model.graph.name, len(model.graph.node), {k: np.shape(v) for k, v in list(feeds.items())[:3]})
