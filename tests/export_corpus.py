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
}
NEEDS_TRANSFORMERS = {name for name in MODELS if not name.startswith(("cnn", "unet", "rnn"))}
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
                dims = {d: Dim(d, min=2, max=64) for per in axes.values() for d in per.values()}
                shapes = {n: {i: dims[d] for i, d in per.items()} for n, per in axes.items()}
                prog = torch.onnx.export(module, args, dynamo=True, opset_version=spec.opset, input_names=names,
                                         output_names=["y"], dynamic_shapes=shapes)
                prog.save(tmp)
            else:
                torch.onnx.export(module, args, tmp, dynamo=False, opset_version=spec.opset, input_names=names,
                                  output_names=["y"], dynamic_axes=axes)

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
