"""The exported-model corpus of tests/test_real_exports.py: how each model is built and exported.

Models are built with random weights (a fixed seed) from small configs, exported once per machine into
a cache outside the repo (RLX_TEST_EXPORTS, else the user cache folder), keyed by the torch,
transformers and onnx versions and a hash of this file: editing an export here re-exports.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


@dataclass(frozen=True)
class Spec:
    build: Callable  # () -> (module, example args, input names, dynamic axes)
    shapes: tuple    # two feeds' shapes: ({input: shape}, {input: shape})
    opset: int = 17
    slow: bool = False
    ints: dict = field(default_factory=dict)  # integer inputs: name -> exclusive upper bound of the values
    masks: tuple = ()  # attention-mask inputs: ones, then a padded (zero) tail on every row but the first
    outputs: tuple = ("y",)  # output names, in the module's return order
    # outputs picked by a discontinuous selection (TopK indices): a lossy profile may pick other entries, so they
    # are held to the exact profile only
    selected: tuple = ()


def _torch():
    import torch
    torch.manual_seed(0)
    return torch


def _cnn():
    torch = _torch()
    nn = torch.nn

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
            self.c2, self.bn2 = nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16)
            self.drop, self.fc = nn.Dropout(0.2), nn.Linear(16, 10)

        def forward(self, x):
            x = torch.relu(self.bn1(self.c1(x)))
            x = nn.functional.max_pool2d(torch.relu(self.bn2(self.c2(x))), 2, ceil_mode=True)
            return self.fc(self.drop(x.mean((2, 3))))

    m = CNN()
    for bn in (m.bn1, m.bn2):  # non-trivial running statistics
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    return m.eval(), (torch.randn(1, 3, 32, 32),), ["x"], {"x": {0: "batch", 2: "h", 3: "w"}}


def _unet():
    """Down, up to the skip connection's size (F.interpolate(size=...): Resize sizes from Shape), concat."""
    torch = _torch()
    nn = torch.nn

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc, self.down = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 16, 3, stride=2, padding=1)
            self.up, self.head = nn.Conv2d(16, 8, 1), nn.Conv2d(16, 4, 3, padding=1)

        def forward(self, x):
            skip = torch.relu(self.enc(x))
            deep = torch.relu(self.down(skip))
            up = nn.functional.interpolate(self.up(deep), size=skip.shape[2:], mode="bilinear", align_corners=False)
            return self.head(torch.cat([up, skip], 1))

    return UNet().eval(), (torch.randn(1, 3, 32, 32),), ["x"], {"x": {0: "batch", 2: "h", 3: "w"}}


def _rnn():
    """Batch-first 2-layer bidirectional LSTM, then a GRU seeded with the LSTM's last state, then a Linear."""
    torch = _torch()
    nn = torch.nn

    class RNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(8, 6, num_layers=2, bidirectional=True, batch_first=True)
            self.gru, self.fc = nn.GRU(12, 6, batch_first=True), nn.Linear(6, 4)

        def forward(self, x):
            y, (h, _) = self.lstm(x)
            z, _ = self.gru(y, h[-1:].contiguous())
            return self.fc(z)

    return RNN().eval(), (torch.randn(2, 5, 8),), ["x"], {"x": {0: "batch", 1: "seq"}}


def _hf(kind: str):
    torch = _torch()
    import transformers as T
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    if kind == "bert":
        model = T.BertModel(T.BertConfig(vocab_size=100, max_position_embeddings=64, **small))
    elif kind == "distilbert":
        model = T.DistilBertModel(T.DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                                     max_position_embeddings=64))
    elif kind == "roberta":
        model = T.RobertaModel(T.RobertaConfig(vocab_size=100, max_position_embeddings=70, **small))
    elif kind == "gpt2":
        model = T.GPT2Model(T.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                         use_cache=False))
    elif kind == "llama":  # RMSNorm, RoPE, grouped-query attention (2 key/value heads for 4 query heads)
        model = T.LlamaModel(T.LlamaConfig(vocab_size=100, num_key_value_heads=2, max_position_embeddings=64,
                                           use_cache=False, **small))
    elif kind == "qwen2":
        model = T.Qwen2Model(T.Qwen2Config(vocab_size=100, num_key_value_heads=2, max_position_embeddings=64,
                                           use_cache=False, **small))
    elif kind == "vit":
        model = T.ViTModel(T.ViTConfig(image_size=32, patch_size=8, num_channels=3, **small))
    else:
        raise KeyError(kind)
    model.eval()
    decoder = kind in ("gpt2", "llama", "qwen2")

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, x):
            if kind == "vit":
                return self.m(pixel_values=x).last_hidden_state
            if decoder:  # an explicit all-ones mask keeps the exporter off packed-sequence detection
                return self.m(input_ids=x, attention_mask=torch.ones_like(x), use_cache=False).last_hidden_state
            return self.m(input_ids=x).last_hidden_state

    if kind == "vit":
        return Wrap(), (torch.randn(1, 3, 32, 32),), ["x"], {"x": {0: "batch"}}
    return Wrap(), (torch.randint(0, 100, (2, 8)),), ["x"], {"x": {0: "batch", 1: "seq"}}


def _sentence_bert():
    """A sentence-transformers encoder: BERT with attention mask and token types, mean pooling, L2 norm."""
    torch = _torch()
    import transformers as T
    bert = T.BertModel(T.BertConfig(vocab_size=100, max_position_embeddings=64, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=64)).eval()

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, ids, mask, types):
            h = self.bert(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
            m = mask.unsqueeze(-1).to(h.dtype)
            return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1)

    axes = {0: "batch", 1: "seq"}
    args = (torch.randint(0, 100, (2, 8)), torch.ones(2, 8, dtype=torch.long), torch.zeros(2, 8, dtype=torch.long))
    return Encoder(), args, ["ids", "mask", "types"], {"ids": axes, "mask": axes, "types": axes}


def _kv_step(kind: str, prefill: bool = False):
    """A decoder with a KV cache, as generation runs it: one new token per sequence, the past keys/values
    of every layer as inputs and the presents (past + 1 along the sequence) as outputs; prefill: the prompt
    with no past in, the presents out."""
    torch = _torch()
    import transformers as T
    if kind == "gpt2":
        cfg = T.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64)
        model, heads = T.GPT2Model(cfg), 4
    elif kind == "llama":  # RMSNorm, RoPE (positions from the past length), GQA: 2 key/value heads for 4 query heads
        cfg = T.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)
        model, heads = T.LlamaModel(cfg), 2
    else:
        raise KeyError(kind)
    model.eval()
    layers, dim = 2, 8
    kv = [f"{w}{i}" for i in range(layers) for w in ("past_key", "past_value")]
    present = [f"present_{w}{i}" for i in range(layers) for w in ("key", "value")]

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, ids, mask, past_key0=None, past_value0=None, past_key1=None, past_value1=None):
            past = [(past_key0, past_value0), (past_key1, past_value1)] if past_key0 is not None else None
            cache = T.DynamicCache(ddp_cache_data=past, config=cfg)
            out = self.m(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
            return (out.last_hidden_state, *(t for layer in out.cache.layers for t in (layer.keys, layer.values)))

    if prefill:
        seq = {0: "batch", 1: "seq"}
        axes = {"ids": seq, "mask": seq, **{n: {0: "batch", 2: "seq"} for n in present}}
        args = (torch.randint(0, 100, (2, 8)), torch.ones(2, 8, dtype=torch.long))
        return Step(), args, ["ids", "mask"], axes
    # the mask covers the past and the new token: its length is the past's + 1
    axes = {"ids": {0: "batch"}, "mask": {0: "batch", 1: "past+1"}, **{n: {0: "batch", 2: "past"} for n in kv},
            **{n: {0: "batch", 2: "past+1"} for n in present}}
    args = (torch.randint(0, 100, (2, 1)), torch.ones(2, 6, dtype=torch.long),
            *(torch.randn(2, heads, 5, dim) for _ in kv))
    return Step(), args, ["ids", "mask", *kv], axes


def kv_shapes(heads: int, batches: tuple = (1, 3), pasts: tuple = (3, 9), layers: int = 2, dim: int = 8) -> tuple:
    """The feed shapes of decoding steps at the given batch sizes and past lengths."""
    return tuple({"ids": (b, 1), "mask": (b, p + 1),
                  **{f"{w}{i}": (b, heads, p, dim) for i in range(layers) for w in ("past_key", "past_value")}}
                 for b, p in zip(batches, pasts, strict=True))


_PRESENTS = ("y", "present_key0", "present_value0", "present_key1", "present_value1")


def _t5_encoder():
    """T5EncoderModel: relative position buckets (log of the distance, clamped), RMS-style T5LayerNorm, no biases."""
    torch = _torch()
    import transformers as T
    model = T.T5EncoderModel(T.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                        relative_attention_num_buckets=8, relative_attention_max_distance=16)).eval()

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, x):
            return self.m(input_ids=x).last_hidden_state

    return Wrap(), (torch.randint(0, 100, (2, 8)),), ["x"], {"x": {0: "batch", 1: "seq"}}


def _whisper_encoder():
    """WhisperEncoder on log-mel features: two Conv1d + GELU front end (stride 2), sinusoidal positions, encoder
    layers; Whisper fixes the frame count (2 x max_source_positions), so only the batch is dynamic."""
    torch = _torch()
    import transformers as T
    cfg = T.WhisperConfig(num_mel_bins=16, d_model=32, encoder_layers=2, encoder_attention_heads=4,
                          encoder_ffn_dim=64, decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=64,
                          max_source_positions=24, vocab_size=100, pad_token_id=0,
                          bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    model = T.WhisperModel(cfg).get_encoder().eval()

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, x):
            return self.m(input_features=x).last_hidden_state

    return Wrap(), (torch.randn(2, 16, 48),), ["x"], {"x": {0: "batch"}}


# ------------------------------------------------------------------------------------------- vision models
# torchvision does not install beside this machine's torch 2.13 CPU build, so its architectures are written
# here from their papers' descriptions in plain torch.nn: small widths and depths, every op pattern kept (eval
# mode, BatchNorm with random running statistics). Example inputs have batch 2: torch.export specializes a
# dynamic dim whose example is 1.


def _random_bn(model):
    for m in model.modules():
        if hasattr(m, "running_var") and m.running_var is not None:  # BatchNorm: non-trivial statistics
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    return model.eval()


def _conv_bn(nn, cin, cout, k, stride=1, groups=1, act=None):
    layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([act()] if act else []))


def _image(builder, spatial: bool = True):
    torch = _torch()
    model = _random_bn(builder(torch, torch.nn))
    axes = {0: "batch", 2: "h", 3: "w"} if spatial else {0: "batch"}
    return model, (torch.randn(2, 3, 32, 32),), ["x"], {"x": axes}


def _resnet18(torch, nn):
    """ResNet-18 (He et al. 2015): 7x7/2 stem, 3x3/2 max pool, four stages of two BasicBlocks (a 1x1/2 conv +
    BatchNorm projection where the shape changes), global average pool, fc."""

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1, self.c2 = _conv_bn(nn, cin, cout, 3, stride, act=nn.ReLU), _conv_bn(nn, cout, cout, 3)
            self.down = _conv_bn(nn, cin, cout, 1, stride) if stride != 1 or cin != cout else None

        def forward(self, x):
            skip = x if self.down is None else self.down(x)
            return torch.relu(self.c2(self.c1(x)) + skip)

    class ResNet(nn.Module):
        def __init__(self, widths=(8, 16, 32, 64)):
            super().__init__()
            self.stem = nn.Sequential(_conv_bn(nn, 3, widths[0], 7, 2, act=nn.ReLU), nn.MaxPool2d(3, 2, 1))
            blocks, cin = [], widths[0]
            for i, w in enumerate(widths):
                blocks += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
                cin = w
            self.layers, self.pool, self.fc = nn.Sequential(*blocks), nn.AdaptiveAvgPool2d((1, 1)), nn.Linear(cin, 10)

        def forward(self, x):
            return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))

    return ResNet()


def _se(nn, c, squeeze, act, gate):
    """Squeeze-excitation (Hu et al.): global average pool, 1x1 conv down, activation, 1x1 conv up, gate."""

    class SE(nn.Module):
        def __init__(self):
            super().__init__()
            self.pool, self.fc1, self.fc2 = nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, squeeze, 1), nn.Conv2d(squeeze, c, 1)
            self.act, self.gate = act(), gate()

        def forward(self, x):
            return x * self.gate(self.fc2(self.act(self.fc1(self.pool(x)))))

    return SE()


def _mobilenet_v3_small(torch, nn):
    """MobileNetV3-Small (Howard et al. 2019): inverted residuals (1x1 expand, kxk depthwise, SE with a
    Hardsigmoid gate, 1x1 project), ReLU or Hardswish per block, residual where stride 1 and widths match;
    1x1 conv + Hardswish head, average pool, Linear + Hardswish + Dropout + Linear."""

    class InvertedResidual(nn.Module):
        def __init__(self, cin, k, exp, cout, se, act, stride):
            super().__init__()
            layers = [] if exp == cin else [_conv_bn(nn, cin, exp, 1, act=act)]
            layers.append(_conv_bn(nn, exp, exp, k, stride, groups=exp, act=act))
            if se:
                layers.append(_se(nn, exp, max(8, exp // 4), nn.ReLU, nn.Hardsigmoid))
            layers.append(_conv_bn(nn, exp, cout, 1))
            self.block, self.residual = nn.Sequential(*layers), stride == 1 and cin == cout

        def forward(self, x):
            y = self.block(x)
            return x + y if self.residual else y

    RE, HS = nn.ReLU, nn.Hardswish
    # (kernel, expanded, out, SE, activation, stride): the paper's table, narrowed and shortened
    cfg = [(3, 16, 16, True, RE, 2), (3, 32, 16, False, RE, 2), (3, 40, 16, False, RE, 1),
           (5, 48, 24, True, HS, 2), (5, 64, 24, True, HS, 1), (5, 96, 32, True, HS, 2)]

    class MobileNetV3(nn.Module):
        def __init__(self):
            super().__init__()
            layers, cin = [_conv_bn(nn, 3, 16, 3, 2, act=HS)], 16
            for k, exp, cout, se, act, stride in cfg:
                layers.append(InvertedResidual(cin, k, exp, cout, se, act, stride))
                cin = cout
            layers.append(_conv_bn(nn, cin, 6 * cin, 1, act=HS))
            self.features, self.pool = nn.Sequential(*layers), nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Sequential(nn.Linear(6 * cin, 64), HS(), nn.Dropout(0.2), nn.Linear(64, 10))

        def forward(self, x):
            return self.classifier(torch.flatten(self.pool(self.features(x)), 1))

    return MobileNetV3()


def _stochastic_depth(nn, p):
    class StochasticDepth(nn.Module):
        """Drops a residual branch per sample while training (Huang et al.); the identity at inference."""

        def forward(self, x):
            if not self.training or p == 0.0:
                return x
            keep = x.new_empty([x.shape[0]] + [1] * (x.ndim - 1)).bernoulli_(1.0 - p)
            return x * keep / (1.0 - p)

    return StochasticDepth()


def _efficientnet_b0(torch, nn):
    """EfficientNet-B0 (Tan & Le 2019): MBConv blocks (1x1 expand x6, kxk depthwise, SE with SiLU and a
    Sigmoid gate at a quarter of the block's input width, 1x1 project, stochastic depth on the residual),
    SiLU throughout; 1x1 head conv, average pool, Dropout, Linear."""

    class MBConv(nn.Module):
        def __init__(self, cin, cout, k, stride, expand, drop):
            super().__init__()
            exp = cin * expand
            layers = [] if expand == 1 else [_conv_bn(nn, cin, exp, 1, act=nn.SiLU)]
            layers += [_conv_bn(nn, exp, exp, k, stride, groups=exp, act=nn.SiLU),
                       _se(nn, exp, max(1, cin // 4), nn.SiLU, nn.Sigmoid), _conv_bn(nn, exp, cout, 1)]
            self.block, self.residual = nn.Sequential(*layers), stride == 1 and cin == cout
            self.drop = _stochastic_depth(nn, drop)

        def forward(self, x):
            y = self.block(x)
            return x + self.drop(y) if self.residual else y

    # (expand, kernel, stride, in, out, repeats): B0's seven stages, narrowed, at most two blocks each
    cfg = [(1, 3, 1, 16, 8, 1), (6, 3, 2, 8, 12, 2), (6, 5, 2, 12, 16, 2), (6, 3, 2, 16, 24, 2),
           (6, 5, 1, 24, 32, 2), (6, 5, 2, 32, 48, 2), (6, 3, 1, 48, 64, 1)]

    class EfficientNet(nn.Module):
        def __init__(self):
            super().__init__()
            layers, n, total = [_conv_bn(nn, 3, 16, 3, 2, act=nn.SiLU)], 0, sum(c[-1] for c in cfg)
            for expand, k, stride, cin, cout, reps in cfg:
                for r in range(reps):
                    layers.append(MBConv(cin if r == 0 else cout, cout, k, stride if r == 0 else 1, expand,
                                         0.2 * n / total))
                    n += 1
            layers.append(_conv_bn(nn, 64, 128, 1, act=nn.SiLU))
            self.features, self.pool = nn.Sequential(*layers), nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Sequential(nn.Dropout(0.2, inplace=True), nn.Linear(128, 10))

        def forward(self, x):
            return self.classifier(torch.flatten(self.pool(self.features(x)), 1))

    return EfficientNet()


def _regnet_y(torch, nn):
    """RegNetY-400MF-like (Radosavovic et al. 2020): 3x3/2 stem; stages of bottleneck blocks (1x1, 3x3 group
    conv of group width 8 carrying the stride, SE at a quarter of the block's input width, 1x1; projection
    shortcut where the shape changes; ReLU after the sum); the first stage has no SE (RegNetX's block)."""

    class Bottleneck(nn.Module):
        def __init__(self, cin, cout, stride, group_width, se):
            super().__init__()
            layers = [_conv_bn(nn, cin, cout, 1, act=nn.ReLU),
                      _conv_bn(nn, cout, cout, 3, stride, groups=cout // group_width, act=nn.ReLU)]
            if se:
                layers.append(_se(nn, cout, max(1, cin // 4), nn.ReLU, nn.Sigmoid))
            self.f = nn.Sequential(*layers, _conv_bn(nn, cout, cout, 1))
            self.proj = _conv_bn(nn, cin, cout, 1, stride) if stride != 1 or cin != cout else None

        def forward(self, x):
            return torch.relu((x if self.proj is None else self.proj(x)) + self.f(x))

    class RegNet(nn.Module):
        def __init__(self, widths=(16, 32, 48, 64), depths=(1, 2, 2, 1)):
            super().__init__()
            layers, cin = [_conv_bn(nn, 3, 16, 3, 2, act=nn.ReLU)], 16
            for i, (w, d) in enumerate(zip(widths, depths, strict=True)):
                for j in range(d):
                    layers.append(Bottleneck(cin, w, 2 if j == 0 else 1, 8, se=i > 0))
                    cin = w
            self.trunk, self.pool, self.fc = nn.Sequential(*layers), nn.AdaptiveAvgPool2d((1, 1)), nn.Linear(cin, 10)

        def forward(self, x):
            return self.fc(self.pool(self.trunk(x)).flatten(start_dim=1))

    return RegNet()


def _convnext_tiny(torch, nn):
    """ConvNeXt-Tiny-like (Liu et al. 2022): 4x4/4 patchify stem + channel LayerNorm; blocks of 7x7 depthwise
    conv, permute to channels-last, LayerNorm, Linear x4, GELU, Linear, layer scale, permute back, stochastic
    depth, residual; LayerNorm + 2x2/2 conv between stages; average pool, LayerNorm, Linear."""

    class LayerNorm2d(nn.LayerNorm):
        def forward(self, x):  # over the channels of NCHW: through channels-last
            x = x.permute(0, 2, 3, 1)
            return nn.functional.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps).permute(
                0, 3, 1, 2)

    class Block(nn.Module):
        def __init__(self, c, drop):
            super().__init__()
            self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
            self.norm, self.fc1, self.act, self.fc2 = nn.LayerNorm(c, eps=1e-6), nn.Linear(c, 4 * c), nn.GELU(), \
                nn.Linear(4 * c, c)
            self.scale = nn.Parameter(torch.rand(c, 1, 1) * 0.5 + 0.1)  # layer scale (1e-6 at init; trained)
            self.drop = _stochastic_depth(nn, drop)

        def forward(self, x):
            y = self.fc2(self.act(self.fc1(self.norm(self.dw(x).permute(0, 2, 3, 1))))).permute(0, 3, 1, 2)
            return x + self.drop(self.scale * y)

    class ConvNeXt(nn.Module):
        def __init__(self, widths=(16, 32, 64, 128), depths=(2, 1, 2, 1)):
            super().__init__()
            layers = [nn.Sequential(nn.Conv2d(3, widths[0], 4, 4), LayerNorm2d(widths[0], eps=1e-6))]
            n, total = 0, sum(depths)
            for i, (w, d) in enumerate(zip(widths, depths, strict=True)):
                if i:
                    layers.append(nn.Sequential(LayerNorm2d(widths[i - 1], eps=1e-6),
                                                nn.Conv2d(widths[i - 1], w, 2, 2)))
                for _ in range(d):
                    layers.append(Block(w, 0.1 * n / total))
                    n += 1
            self.features, self.pool = nn.Sequential(*layers), nn.AdaptiveAvgPool2d(1)
            self.head = nn.Sequential(LayerNorm2d(widths[-1], eps=1e-6), nn.Flatten(1), nn.Linear(widths[-1], 10))

        def forward(self, x):
            return self.head(self.pool(self.features(x)))

    return ConvNeXt()


def _small_vit(torch, nn):
    """A small ViT (Dosovitskiy et al. 2020), ViT-B/16's layout: patch embedding conv (kernel = stride = 8),
    class token, learned position embedding, pre-norm encoder blocks (nn.MultiheadAttention, MLP with GELU),
    final LayerNorm, Linear on the class token."""

    class EncoderBlock(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.ln1, self.attn = nn.LayerNorm(d, eps=1e-6), nn.MultiheadAttention(d, heads, batch_first=True)
            self.ln2 = nn.LayerNorm(d, eps=1e-6)
            self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Dropout(0.0), nn.Linear(2 * d, d))

        def forward(self, x):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class ViT(nn.Module):
        def __init__(self, image=32, patch=8, d=32, heads=4, layers=2):
            super().__init__()
            self.patch, self.d, self.p = nn.Conv2d(3, d, patch, patch), d, patch
            self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
            self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, d) * 0.02)
            self.blocks = nn.Sequential(*(EncoderBlock(d, heads) for _ in range(layers)))
            self.ln, self.head = nn.LayerNorm(d, eps=1e-6), nn.Linear(d, 10)

        def forward(self, x):
            n, _, h, w = x.shape  # patches as ViT-B/16 lays them out: a reshape with sizes from the input's
            x = self.patch(x).reshape(n, self.d, (h // self.p) * (w // self.p)).permute(0, 2, 1)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
            return self.head(self.ln(self.blocks(x))[:, 0])

    return ViT()


def _detector():
    """An FCOS-like one-stage detector (Tian et al. 2019): the input normalized and resized (bilinear), a
    strided conv backbone with frozen BatchNorm (scale and shift from buffers), an FPN neck (1x1 laterals,
    nearest upsampling to the finer level's size, 3x3 outputs, a stride-2 P6), a head shared across levels
    (conv + GroupNorm + ReLU towers; class scores through Sigmoid, box distances through ReLU, centerness
    through Sigmoid), each level's maps flattened and concatenated; then the pre-NMS post-processing: each
    location's center from its level's size and stride (arange, meshgrid), distances decoded to corner boxes
    clipped to the image, the top 20 (location, class) scores per image (TopK), their boxes gathered and their
    labels. NMS itself is torchvision's custom op, out of reach here."""
    torch = _torch()
    nn = torch.nn

    class FrozenBatchNorm2d(nn.Module):
        """Detection backbones' BatchNorm with fixed statistics, written out: x * scale + shift from buffers."""

        def __init__(self, c):
            super().__init__()
            for name, v in (("weight", torch.rand(c) + 0.5), ("bias", torch.rand(c) - 0.5),
                            ("running_mean", torch.rand(c) - 0.5), ("running_var", torch.rand(c) + 0.5)):
                self.register_buffer(name, v)

        def forward(self, x):
            scale = self.weight * (self.running_var + 1e-5).rsqrt()
            shift = self.bias - self.running_mean * scale
            return x * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1)

    def stage(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, 2, 1, bias=False), FrozenBatchNorm2d(cout), nn.ReLU())

    class Detector(nn.Module):
        def __init__(self, c=16, classes=5):
            super().__init__()
            self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).reshape(1, 3, 1, 1))
            self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1))
            self.c2, self.c3, self.c4, self.c5 = stage(3, 16), stage(16, 24), stage(24, 32), stage(32, 48)
            self.lat = nn.ModuleList(nn.Conv2d(w, c, 1) for w in (24, 32, 48))
            self.out = nn.ModuleList(nn.Conv2d(c, c, 3, padding=1) for _ in range(3))
            self.p6 = nn.Conv2d(c, c, 3, 2, 1)

            def tower():
                return nn.Sequential(*(m for _ in range(2) for m in (nn.Conv2d(c, c, 3, padding=1),
                                                                     nn.GroupNorm(4, c), nn.ReLU())))

            self.cls_tower, self.box_tower = tower(), tower()
            self.cls, self.box, self.ctr = nn.Conv2d(c, classes, 3, padding=1), nn.Conv2d(c, 4, 3, padding=1), \
                nn.Conv2d(c, 1, 3, padding=1)
            self.scales, self.classes = nn.Parameter(torch.tensor([1.0, 1.5, 2.0, 2.5])), classes

        def forward(self, x):
            # the detection transform: normalize, then resize (bilinear, scale factor, sizes from the input's)
            x = nn.functional.interpolate((x - self.mean) / self.std, scale_factor=1.25, mode="bilinear",
                                          align_corners=False, recompute_scale_factor=True)
            c3 = self.c3(self.c2(x))
            c4 = self.c4(c3)
            feats = [c3, c4, self.c5(c4)]
            lat = [m(f) for m, f in zip(self.lat, feats, strict=True)]
            for i in (1, 0):  # top-down: upsample the coarser level to this level's size, add
                lat[i] = lat[i] + nn.functional.interpolate(lat[i + 1], size=lat[i].shape[-2:], mode="nearest")
            levels = [m(f) for m, f in zip(self.out, lat, strict=True)]
            levels.append(self.p6(levels[-1]))
            scores, boxes = [], []
            for i, p in enumerate(levels):
                t, b = self.cls_tower(p), self.box_tower(p)
                logits = self.cls(t)
                n, _, h, w = logits.shape  # RetinaNet's head layout: [N, A*K, H, W] -> [N, H*W*A, K] through 5-D
                logits = logits.view(n, -1, self.classes, h, w).permute(0, 3, 4, 1, 2).reshape(n, -1, self.classes)
                s = torch.sigmoid(logits) * torch.sigmoid(self.ctr(b)).flatten(2).permute(0, 2, 1)
                d = torch.relu(self.box(b) * self.scales[i]).flatten(2).permute(0, 2, 1)
                stride = x.shape[-1] / p.shape[-1]  # this level's stride, from the sizes at run time
                ys, xs = torch.meshgrid(torch.arange(p.shape[-2], dtype=x.dtype), torch.arange(p.shape[-1],
                                                                                            dtype=x.dtype),
                                        indexing="ij")
                centers = (torch.stack([xs, ys], -1).reshape(-1, 2) + 0.5) * stride
                scores.append(s)
                boxes.append(torch.cat([centers - d[..., :2] * stride, centers + d[..., 2:] * stride], -1))
            scores, boxes = torch.cat(scores, 1), torch.cat(boxes, 1)
            # clipped to the image (clamp bounds from its size at run time), x and y by strided slices
            bx, by = boxes[..., 0::2].clamp(min=0, max=x.shape[-1]), boxes[..., 1::2].clamp(min=0, max=x.shape[-2])
            boxes = torch.stack((bx, by), dim=-1).reshape(boxes.shape)
            top, idx = scores.flatten(1).topk(20, dim=1)
            where = (idx // scores.shape[-1]).unsqueeze(-1).expand(-1, -1, 4)
            return scores, boxes, top, torch.gather(boxes, 1, where), idx % scores.shape[-1]

    m = _random_bn(Detector())
    return m, (torch.randn(2, 3, 64, 64),), ["x"], {"x": {0: "batch", 2: "h", 3: "w"}}


_IDS = ({"x": (1, 5)}, {"x": (3, 11)})
_IMG = ({"x": (1, 3, 32, 32)}, {"x": (2, 3, 48, 40)})
MODELS: dict[str, Spec] = {
    "cnn": Spec(_cnn, _IMG),
    "unet": Spec(_unet, ({"x": (1, 3, 32, 32)}, {"x": (2, 3, 21, 17)})),
    "rnn": Spec(_rnn, ({"x": (1, 5, 8)}, {"x": (3, 9, 8)})),
    "bert": Spec(lambda: _hf("bert"), _IDS, ints={"x": 100}),
    "sentence-bert": Spec(_sentence_bert, tuple({n: shape for n in ("ids", "mask", "types")} for shape in
                                                ((1, 5), (3, 11))), ints={"ids": 100, "types": 2}, masks=("mask",)),
    "gpt2": Spec(lambda: _hf("gpt2"), _IDS, ints={"x": 100}),
    "cnn-opset11": Spec(_cnn, _IMG, opset=11, slow=True),
    "bert-opset14": Spec(lambda: _hf("bert"), _IDS, opset=14, slow=True, ints={"x": 100}),
    "bert-opset20": Spec(lambda: _hf("bert"), _IDS, opset=20, slow=True, ints={"x": 100}),
    "distilbert": Spec(lambda: _hf("distilbert"), _IDS, slow=True, ints={"x": 100}),
    "roberta": Spec(lambda: _hf("roberta"), _IDS, slow=True, ints={"x": 100}),
    "llama": Spec(lambda: _hf("llama"), _IDS, slow=True, ints={"x": 100}),
    "qwen2": Spec(lambda: _hf("qwen2"), _IDS, slow=True, ints={"x": 100}),
    "vit": Spec(lambda: _hf("vit"), ({"x": (1, 3, 32, 32)}, {"x": (3, 3, 32, 32)}), slow=True),
    "gpt2-step": Spec(lambda: _kv_step("gpt2"), kv_shapes(4), ints={"ids": 100}, masks=("mask",),
                      outputs=_PRESENTS),
    "gpt2-prefill": Spec(lambda: _kv_step("gpt2", prefill=True), ({"ids": (1, 5), "mask": (1, 5)},
                                                                   {"ids": (3, 11), "mask": (3, 11)}),
                         slow=True, ints={"ids": 100}, masks=("mask",), outputs=_PRESENTS),
    "gpt2-step-opset18": Spec(lambda: _kv_step("gpt2"), kv_shapes(4), opset=18, slow=True, ints={"ids": 100},
                              masks=("mask",), outputs=_PRESENTS),
    "gpt2-step-opset23": Spec(lambda: _kv_step("gpt2"), kv_shapes(4), opset=23, slow=True, ints={"ids": 100},
                              masks=("mask",), outputs=_PRESENTS),
    "llama-step": Spec(lambda: _kv_step("llama"), kv_shapes(2), slow=True, ints={"ids": 100}, masks=("mask",),
                       outputs=_PRESENTS),
    # dynamo at opset 23 writes RotaryEmbedding with batch-1 cos/sin caches, which onnxruntime refuses at a batch
    # > 1 (the op's spec: [batch, seq, rot/2]): one sequence per step here
    "llama-step-opset23": Spec(lambda: _kv_step("llama"), kv_shapes(2, batches=(1, 1)), opset=23, slow=True,
                               ints={"ids": 100}, masks=("mask",), outputs=_PRESENTS),
    "t5-encoder": Spec(_t5_encoder, _IDS, slow=True, ints={"x": 100}),
    "whisper-encoder": Spec(_whisper_encoder, ({"x": (1, 16, 48)}, {"x": (3, 16, 48)}), slow=True),
    "resnet18": Spec(lambda: _image(_resnet18), _IMG, slow=True),
    "mobilenet-v3-small": Spec(lambda: _image(_mobilenet_v3_small), _IMG),
    "efficientnet-b0": Spec(lambda: _image(_efficientnet_b0), _IMG, slow=True),
    "regnet-y": Spec(lambda: _image(_regnet_y), _IMG, slow=True),
    "convnext-tiny": Spec(lambda: _image(_convnext_tiny), _IMG, slow=True),
    "small-vit": Spec(lambda: _image(_small_vit, spatial=False), ({"x": (1, 3, 32, 32)}, {"x": (3, 3, 32, 32)}),
                      slow=True),
    "fcos-detector": Spec(_detector, ({"x": (1, 3, 64, 64)}, {"x": (2, 3, 40, 56)}),
                          outputs=("scores", "boxes", "top_scores", "top_boxes", "labels"),
                          selected=("top_boxes", "labels")),
    # opset 21: the dynamo exporter writes GroupNormalization (per-channel affine) for the towers' nn.GroupNorm
    "fcos-detector-opset21": Spec(_detector, ({"x": (1, 3, 64, 64)}, {"x": (2, 3, 40, 56)}), opset=21, slow=True,
                                  outputs=("scores", "boxes", "top_scores", "top_boxes", "labels"),
                                  selected=("top_boxes", "labels")),
}
# the torchvision architectures above (plain torch.nn)
VISION = {"resnet18", "mobilenet-v3-small", "efficientnet-b0", "regnet-y", "convnext-tiny", "small-vit",
          "fcos-detector", "fcos-detector-opset21"}
NEEDS_TRANSFORMERS = {name for name in MODELS if not name.startswith(("cnn", "unet", "rnn")) and name not in VISION}
FAST_DYNAMO = {"bert", "sentence-bert"}  # the dynamo exports in the fast tier (when onnxscript is installed)
# dynamo exports that fail before rlx is involved (torch 2.13, onnxscript 0.7), measured on this corpus: kept as
# strict xfails so that a fixed exporter turns them into failures to update, never silent passes
DYNAMO_EXPORTER_FAILS = {
    "cnn": "torch.export specializes the dynamic batch dim (ConstraintViolationError: 1 not in range [2, 64])",
    "cnn-opset11": "torch.export specializes the dynamic batch dim (ConstraintViolationError)",
    "unet": "torch.export specializes the dynamic batch dim (ConstraintViolationError)",
    "vit": "torch.export specializes the dynamic batch dim (ConstraintViolationError)",
    "gpt2": "onnxruntime cannot load the export (INVALID_GRAPH: a Split with no split sizes)",
    "rnn": "the export bakes the example's sequence length into a Reshape ([5, -1, 12]); onnxruntime fails the "
           "same way at another length",
    "gpt2-step": "onnxruntime cannot load the export (INVALID_GRAPH: Split with opset 18's num_outputs at opset 17)",
    "gpt2-prefill": "onnxruntime cannot load the export (INVALID_GRAPH: Split with opset 18's num_outputs at "
                    "opset 17)",
    "t5-encoder": "torch.export's decomposition fails (ValueError: cannot view the [batch, seq, 4, 8] attention "
                  "output as [batch, seq, 32])",
}


def cache_dir() -> Path:
    import torch
    try:
        import transformers
        tv = transformers.__version__
    except ImportError:
        tv = "none"
    key = hashlib.sha256("|".join([torch.__version__, tv, onnx.__version__]).encode()
                         + Path(__file__).read_bytes()).hexdigest()[:16]
    root = os.environ.get("RLX_TEST_EXPORTS")
    if not root:
        from platformdirs import user_cache_dir
        root = os.path.join(user_cache_dir("rlx"), "test-exports")
    d = Path(root) / key
    d.mkdir(parents=True, exist_ok=True)
    return d


def _atomic_save(path: Path, write: Callable[[str], None]) -> Path:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(str(tmp))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def export(name: str, dynamo: bool, root: Path) -> Path:
    """The cached export of MODELS[name] (torch.onnx.export, TorchScript or dynamo exporter)."""
    path = root / f"{name}-{'dynamo' if dynamo else 'torchscript'}.onnx"
    if path.is_file():
        return path
    spec = MODELS[name]
    module, args, names, axes = spec.build()
    import torch

    def write(tmp: str) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if dynamo:
                from torch.export import Dim
                # "past+1": a dim derived from another (a decoding step's mask covers the past and the new token)
                dims = {d: Dim(d, min=2, max=64) for n in names for d in axes.get(n, {}).values() if "+" not in d}
                shapes = {n: {i: dims[d[:-2]] + 1 if d.endswith("+1") else dims[d] for i, d in axes[n].items()}
                          for n in names if n in axes}
                prog = torch.onnx.export(module, args, dynamo=True, opset_version=spec.opset, input_names=names,
                                         output_names=list(spec.outputs), dynamic_shapes=shapes)
                prog.save(tmp)
            else:
                torch.onnx.export(module, args, tmp, dynamo=False, opset_version=spec.opset, input_names=names,
                                  output_names=list(spec.outputs), dynamic_axes=axes)

    return _atomic_save(path, write)


def quantized(name: str, root: Path, weights: str = "QInt8") -> Path:
    """The TorchScript export of MODELS[name] through onnxruntime.quantization.quantize_dynamic (8-bit
    weights: DynamicQuantizeLinear + MatMulInteger / ConvInteger, a common way production models are shrunk;
    onnxruntime's ConvInteger takes uint8 weights, so CNNs use QUInt8)."""
    path = root / f"{name}-dynamic-{weights}.onnx"
    if path.is_file():
        return path
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic
    src = export(name, False, root)
    logging.getLogger().setLevel(logging.ERROR)  # quantize_dynamic logs advice on the root logger
    return _atomic_save(path, lambda tmp: quantize_dynamic(str(src), tmp, weight_type=getattr(QuantType, weights),
                                                           op_types_to_quantize=["Conv", "MatMul"]))


def light(name: str, root: Path) -> Path:
    """onnx's light_* model with random weights: each ConstantOfShape-filled weight becomes a seeded
    random initializer of that shape (the shipped files fill every weight with one value)."""
    path = root / f"{name}-random.onnx"
    if path.is_file():
        return path
    m = onnx.load(str(LIGHT_DIR / f"{name}.onnx"))
    inits = {t.name: t for t in m.graph.initializer}
    r = np.random.default_rng(0)
    keep = []
    for n in m.graph.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in inits:
            shape = tuple(int(d) for d in numpy_helper.to_array(inits[n.input[0]]))
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            value = (r.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
            if len(shape) == 1:  # biases and BatchNorm vectors: positive, so variances are valid
                value = (0.5 + 0.1 * np.abs(value)).astype(np.float32)
            m.graph.initializer.append(numpy_helper.from_array(value, n.output[0]))
        else:
            keep.append(n)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    m.ir_version = max(m.ir_version, 4)  # IR 3 lists every initializer among the inputs; 4 need not
    return _atomic_save(path, lambda tmp: onnx.save(m, tmp))


LIGHT = sorted(p.stem for p in LIGHT_DIR.glob("light_*.onnx"))
