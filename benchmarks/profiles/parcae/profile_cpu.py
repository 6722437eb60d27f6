"""BERT-large, ResNet-152 and VGG-19 profiled on this CPU with our profiler, times scaled to Parcae's V100.

Parcae's ``cost_cfg.py`` has no usable per-layer numbers for these three (see README.md), so they are measured here.
The models are the standard definitions at Parcae's sizes: BERT from transformers' ``BertConfig`` (24 layers × 1024,
16 heads, vocabulary 30,522, sequence 512: ``liveput/model.py``'s ``bert``) with the masked-LM head; ResNet-152 and
VGG-19 as torchvision defines them (written out below because torchvision's PyPI wheel needs CUDA torch; the parameter
counts are checked against torchvision's published ones), 100 classes and 224 × 224 inputs (what the parameter counts
in ``cost_cfg.py`` imply: VGG-19's first classifier layer is 25,088 × 4,096, the last 4,096 × 100).

Blocks follow Parcae's layering: BERT's embedding, 24 layers and head; ResNet-152's stem, 50 bottlenecks and head;
VGG-19's 16 convolutions (each with its ReLU and the pooling after it) and 3 classifier layers. A run of identical
blocks on identical inputs (BERT's 24 layers, the bottlenecks of one ResNet stage after its first) is measured once and
repeated, which is what makes the profile affordable on two cores; every distinct block is measured.

Scaling: a V100 time is this CPU's time × R, with one R per model chosen so that the whole model's time is its
matmul/convolution FLOPs (``torch.utils.flop_counter``, forward + backward) at ``V100_TFLOPS``: the rate Parcae's own
GPT-1.5B layer sustains on its V100s (see README.md). The CPU's split of the time among blocks and between forward and
backward is kept.
"""

from __future__ import annotations

import copy
import time
from typing import Sequence

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from orchestrator.core.profile import Block, Profile
from orchestrator.profiling.profiler import profile_blocks

# Parcae's gpt-1.5b layer (h = 1600, 1,024 tokens): 1024 × (24h² + 4·1024·h) = 69.63 GFLOP forward in 6.510 ms and
# twice that backward in 13.448 ms: 3 × 69.63 GFLOP / 19.958 ms.
V100_TFLOPS = 3 * 1024 * (24 * 1600**2 + 4 * 1024 * 1600) / 19.958e-3 / 1e12

# ----- ResNet-152 and VGG-19 exactly as torchvision.models builds them ------------------------------------------------


class Bottleneck(nn.Module):
    """torchvision.models.resnet.Bottleneck (ResNet v1.5: the stride on the 3 × 3 convolution)."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = (nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))
                           if stride != 1 or inplanes != out else None)

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        return self.relu(self.bn3(self.conv3(y)) + identity)


def resnet152(num_classes: int = 100) -> list[tuple[str, nn.Module]]:
    blocks: list[tuple[str, nn.Module]] = [("stem", nn.Sequential(
        nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2, padding=1)))]
    inplanes = 64
    for stage, (planes, count, stride) in enumerate(((64, 3, 1), (128, 8, 2), (256, 36, 2), (512, 3, 2)), start=1):
        for i in range(count):
            blocks.append((f"layer{stage}.{i}", Bottleneck(inplanes, planes, stride if i == 0 else 1)))
            inplanes = planes * Bottleneck.expansion
    blocks.append(("head", nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, num_classes))))
    return blocks


VGG19_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M")


def vgg19(num_classes: int = 100) -> list[tuple[str, nn.Module]]:
    """torchvision.models.vgg19 (configuration "E", no batch norm): one block per convolution + ReLU (+ the pooling
    after it), then its classifier's three linear layers (the adaptive pooling and flattening go with the first)."""
    blocks: list[tuple[str, nn.Module]] = []
    channels = 3
    for v in VGG19_CFG:
        if v == "M":
            name, last = blocks[-1]
            blocks[-1] = (name + "+pool", nn.Sequential(*last, nn.MaxPool2d(2, 2)))
        else:
            blocks.append((f"conv{len(blocks)}", nn.Sequential(nn.Conv2d(channels, int(v), 3, padding=1), nn.ReLU(inplace=True))))
            channels = int(v)
    blocks += [("fc0", nn.Sequential(nn.AdaptiveAvgPool2d(7), nn.Flatten(), nn.Linear(512 * 49, 4096), nn.ReLU(True), nn.Dropout())),
               ("fc1", nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout())),
               ("fc2", nn.Linear(4096, num_classes))]
    return blocks


# torchvision's documented parameter counts (1,000 classes) less the classifier rows of the 900 classes not used
TORCHVISION_PARAMS = {"resnet152": 60_192_808 - 900 * 2048 - 900, "vgg19": 143_667_240 - 900 * 4096 - 900}


def bert_large() -> list[tuple[str, nn.Module]]:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                        vocab_size=30522, max_position_embeddings=512)
    model = BertForMaskedLM(config)
    blocks: list[tuple[str, nn.Module]] = [("embed", model.bert.embeddings)]
    blocks += [(f"layer{i}", layer) for i, layer in enumerate(model.bert.encoder.layer)]
    blocks.append(("head", model.cls))
    return blocks


MODELS = {"bert": bert_large, "resnet152": resnet152, "vgg19": vgg19}


def sample(model: str, microbatch_size: int) -> Tensor:
    gen = torch.Generator().manual_seed(0)
    if model == "bert":
        return torch.randint(0, 30522, (microbatch_size, 512), generator=gen)
    return torch.randn(microbatch_size, 3, 224, 224, generator=gen)


# ----- measuring ------------------------------------------------------------------------------------------------------
def runs(blocks: Sequence[nn.Module], x: Tensor) -> tuple[list[int], list[int]]:
    """(index of each run's first block, its length): consecutive blocks alike in structure and input shape."""
    starts: list[int] = []
    lengths: list[int] = []
    key_prev = None
    h = x.to("meta")
    for i, b in enumerate(blocks):
        key = (repr(b), tuple(h.shape))
        if key == key_prev:
            lengths[-1] += 1
        else:
            starts.append(i)
            lengths.append(1)
        key_prev = key
        with torch.no_grad():
            h = copy.deepcopy(b).to("meta")(h)
    return starts, lengths


def flops(block: nn.Module, x: Tensor, first: bool) -> int:
    """Matmul/convolution FLOPs of one forward + backward of ``block`` (counted on the meta device: nothing runs)."""
    meta = copy.deepcopy(block).to("meta")
    inp = x.to("meta")
    if not first:
        inp.requires_grad_(True)
    counter = FlopCounterMode(display=False)
    with counter:
        y = meta(inp)
        y.backward(torch.ones_like(y))
    return int(counter.get_total_flops())


def profile_to_v100(model: str, microbatch_size: int, warmup: int = 1, repeats: int = 3) -> Profile:
    torch.manual_seed(0)
    named = MODELS[model]()
    names = [n for n, _ in named]
    blocks = [b for _, b in named]
    params = sum(p.numel() for b in blocks for p in b.parameters())
    if model in TORCHVISION_PARAMS:
        assert params == TORCHVISION_PARAMS[model], f"{model}: {params} parameters, torchvision has {TORCHVISION_PARAMS[model]}"
    for b in blocks:
        b.train()
    x = sample(model, microbatch_size)
    starts, lengths = runs(blocks, x)
    unique = [blocks[i] for i in starts]
    threads = torch.get_num_threads()
    start = time.perf_counter()
    cpu = profile_blocks(unique, x, model, microbatch_size, warmup=warmup, repeats=repeats, device="cpu")
    wall = time.perf_counter() - start
    # FLOPs of each distinct block, on its own input (the chain's activations, rebuilt on the meta device)
    h = x
    total_flops = 0
    for k, b in enumerate(unique):
        total_flops += flops(b, h, first=k == 0) * lengths[k]
        with torch.no_grad():
            h = copy.deepcopy(b).to("meta")(h.to("meta"))
    cpu_s = sum((blk.forward_s + blk.backward_s) * n for blk, n in zip(cpu.blocks, lengths))
    ratio = total_flops / (V100_TFLOPS * 1e12) / cpu_s
    out: list[Block] = []
    for blk, first, n in zip(cpu.blocks, starts, lengths):
        for j in range(n):
            out.append(Block(names[first + j], blk.forward_s * ratio, blk.backward_s * ratio, blk.activation_bytes,
                             blk.param_bytes, blk.stash_bytes, blk.weight_s * ratio))
    source = (f"profiled by benchmarks/profiles/parcae/make_profiles.py on this CPU ({threads} threads, fp32, "
              f"{len(unique)} distinct of {len(blocks)} blocks in {wall:.0f} s: {cpu_s:.3f} s per micro-batch), times x {ratio:.5f} "
              f"= {total_flops / 1e12:.3f} TFLOP (fwd+bwd matmul/conv) at {V100_TFLOPS:.2f} TFLOPS, the rate Parcae's "
              f"gpt-1.5b layer sustains on a V100; {params} parameters, micro-batch {microbatch_size}")
    print(source)
    return Profile(model, tuple(out), microbatch_size, cpu.input_bytes, source)
