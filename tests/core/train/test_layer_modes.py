"""Layer modes chosen from memory (issue 52, item 4; train/layer_modes.py, train/forward_budget.py): each decoder layer
of a forward keeps its activations, recomputes them in backward, or also holds its input in host memory. On this CPU
the modes run on a small Llama through transformers' own checkpointing (the same gradients in every mode, each
recomputed layer run twice), and the budget's probe and choices are checked against a memory meter standing in for
torch.cuda's allocator readings (tunesmith/plan/fake_device.MemoryMeter, the plan's meter: every storage a tensor
operation creates, until it is freed): what the probe measures predicts what the chosen forward then takes, and the
choice fits the memory it was given."""

from __future__ import annotations

import functools
import weakref

import pytest
import torch

from tests.core.data.test_packing import chat_examples
from tests.core.train.test_memory import llama, loss_and_gradients
from tunesmith.data.collator import PackingCollator
from tunesmith.plan.fake_device import DEVICE, HostCopyStreams, MemoryMeter
from tunesmith.train import forward_budget, layer_modes
from tunesmith.train.callbacks import OffloadOnSideStream
from tunesmith.train.forward_budget import HEADROOM, ForwardBudget
from tunesmith.train.layer_input_offload import LayerInputOffload
from tunesmith.train.layer_modes import (
    LayerModes,
    LayerRates,
    checkpointed_layers,
    choose_modes,
    set_layer_modes,
)

LAYERS = 4


estimate = layer_modes.estimated_forward_bytes


class RecordingOffload(LayerInputOffload):
    """The offload hooks, logging each input's index as it is packed, fetched and unpacked (and whether it was on the
    device already when backward asked for it)."""

    def __init__(self) -> None:
        super().__init__("cpu", streams=HostCopyStreams(), pin_memory=False, min_bytes=0)
        self.index: dict[int, int] = {}
        self.log: list[tuple] = []
        self.hosts: list = []  # weak references to every host copy made

    def _pack(self, tensor):
        entry = super()._pack(tensor)
        self.index[id(entry)] = len(self.index)
        self.hosts.append(weakref.ref(entry.host))
        return entry

    def _fetch(self, entry):
        if entry.on_device is None:
            self.log.append(("fetch", self.index[id(entry)]))
        super()._fetch(entry)

    def _unpack(self, entry):
        self.log.append(("unpack", self.index[id(entry)], entry.on_device is not None))
        return super()._unpack(entry)


@pytest.mark.parametrize("budget", [10**6 * k for k in (1, 3, 5, 8, 12, 20, 40, 80, 400)])
def test_choose_modes_keeps_the_most_layers_that_fit_then_offloads_the_fewest(budget):
    rates = LayerRates(recomputed=1000.0, kept_extra=800.0, offload_saving=100.0)
    tokens, layers = 4000, 16
    modes = choose_modes(tokens, budget, rates, layers)
    assert modes.kept + modes.recomputed + modes.offloaded == layers
    assert modes.kept == 0 or modes.offloaded == 0  # offloading only where nothing can be kept
    if not modes.fits:
        assert modes.offloaded == layers and estimate(tokens, rates, modes) > budget
        return
    assert estimate(tokens, rates, modes) <= budget
    if modes.kept < layers and modes.offloaded == 0:  # keeping one more layer would not fit
        assert estimate(tokens, rates, LayerModes(modes.kept + 1, modes.recomputed - 1, 0)) > budget
    if modes.offloaded:  # offloading one fewer would not fit
        assert estimate(tokens, rates, LayerModes(0, modes.recomputed + 1, modes.offloaded - 1)) > budget
    assert "layers" in modes.describe()


@pytest.fixture(scope="module")
def row(tokenizer) -> dict:
    """One packed row of the four chat examples repeated: 2,968 tokens."""
    return PackingCollator()(chat_examples(tokenizer) * 7)


def test_every_mode_trains_the_same_and_recomputes_only_its_checkpointed_layers(tokenizer, row):
    """LoRA on a 4-layer Llama, checkpointing enabled as the Trainer enables it, then the modes set per layer: the same
    loss and gradients whatever each layer does, and a layer's attention runs twice (forward and recomputation)
    exactly where the layer is checkpointed (recomputed or offloaded)."""
    model = llama(tokenizer, LAYERS, "lora", "plain")
    layers = checkpointed_layers(model)
    assert len(layers) == LAYERS
    calls = [0] * LAYERS
    for index, layer in enumerate(layers):
        layer.self_attn.register_forward_hook(lambda *_, index=index: calls.__setitem__(index, calls[index] + 1))
    results = {}
    for modes in (LayerModes(4, 0, 0), LayerModes(1, 3, 0), LayerModes(0, 4, 0), LayerModes(0, 2, 2),
                  LayerModes(0, 0, 4)):
        set_layer_modes(layers, modes, "cpu")
        calls[:] = [0] * LAYERS
        results[modes] = loss_and_gradients(model, row)
        checkpointed = modes.offloaded + modes.recomputed
        assert calls == [2] * checkpointed + [1] * modes.kept, modes
        for parameter in model.parameters():
            parameter.grad = None
    reference_loss, reference = results[LayerModes(4, 0, 0)]
    for modes, (loss, grads) in results.items():
        assert torch.equal(loss, reference_loss), modes
        for name, grad in grads.items():
            assert torch.allclose(grad, reference[name], rtol=1e-5, atol=1e-7), f"{modes}: {name}"


@pytest.mark.parametrize("offloaded", [4, 2])
def test_offloaded_inputs_come_back_one_layer_ahead_with_the_same_gradients(tokenizer, row, monkeypatch, offloaded):
    """The side-stream offload (train/layer_input_offload.py) with its copies standing in on this CPU: the loss and
    gradients of plain recomputation, bit for bit; in backward each offloaded input but the topmost is already back
    when its layer asks for it (fetched while the layer above ran), in layer order; after backward no host copy is
    left, and a second step prefetches nothing of the first's."""
    model = llama(tokenizer, LAYERS, "lora", "plain")
    layers = checkpointed_layers(model)
    set_layer_modes(layers, LayerModes(0, LAYERS, 0), "cpu")
    reference_loss, reference = loss_and_gradients(model, row)
    offload = RecordingOffload()
    monkeypatch.setattr(layer_modes, "offload_hooks", lambda device_type: offload)
    set_layer_modes(layers, LayerModes(0, LAYERS - offloaded, offloaded), "cpu")
    for _ in range(2):
        offload.log.clear()
        for parameter in model.parameters():
            parameter.grad = None
        loss, grads = loss_and_gradients(model, row)
        assert torch.equal(loss, reference_loss)
        for name, grad in grads.items():
            assert torch.equal(grad, reference[name]), name
        top, *below = sorted(offload.index.values())[-offloaded:][::-1]  # this step's inputs, topmost first
        # the topmost is fetched when its layer asks; from then each is back before its layer asks for it, and its
        # asking brings back the one below
        expected = [("unpack", top, False), ("fetch", top)]
        for index in below:
            expected += [("fetch", index), ("unpack", index, True)]
        assert offload.log == expected, offload.log
        assert all(host() is None for host in offload.hosts), "a host copy outlived its backward"


def test_gradient_checkpointing_offload_moves_every_checkpointed_layer_onto_the_side_stream(tokenizer):
    """--gradient_checkpointing offload on a GPU: transformers' checkpointing (with its save_on_cpu) is enabled by
    train(); the callback then hands every checkpointed layer the side-stream offload, without touching CUDA (the
    hooks are made at the first offloaded forward)."""
    from types import SimpleNamespace

    model = llama(tokenizer, LAYERS, "lora", "plain")
    model.activation_checkpointing_enable(offload=True)
    layers = checkpointed_layers(model)
    OffloadOnSideStream().on_train_begin(SimpleNamespace(device=torch.device("cuda")), None, None, model=model)
    assert all(layer.gradient_checkpointing for layer in layers)
    assert all(layer._gradient_checkpointing_func is layer_modes.recompute_function(True, "cuda") for layer in layers)


class MeteredDevice:
    """torch.cuda's readings on a device of `capacity` bytes, from a MemoryMeter over real CPU tensors; offloaded
    layer inputs copied by train/layer_input_offload.py, counted as host memory."""

    def __init__(self, monkeypatch, capacity: int) -> None:
        self.meter, self.capacity = MemoryMeter(), capacity
        cuda = forward_budget.torch.cuda
        monkeypatch.setattr(cuda, "memory_allocated", lambda device=None: self.meter.current[DEVICE])
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda device=None: self.meter.peak[DEVICE])
        monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda device=None: self.meter.mark())
        monkeypatch.setattr(cuda, "memory_reserved", lambda device=None: self.meter.current[DEVICE])
        monkeypatch.setattr(cuda, "mem_get_info",
                            lambda device=None: (self.capacity - self.meter.current[DEVICE], self.capacity))
        # the offload hooks themselves, their host copies counted as host memory
        offload = LayerInputOffload("cpu", streams=HostCopyStreams(self.meter), pin_memory=False, min_bytes=0)
        monkeypatch.setattr(layer_modes, "offload_hooks", lambda device_type: offload)

    def peak_of(self, run) -> int:
        """The peak above what was held of run(), and run()'s result."""
        held = self.meter.mark()[DEVICE]
        run()
        return self.meter.peak[DEVICE] - held


def forward_and_backward(model, part: dict) -> None:
    model(**part).loss.backward()


@pytest.mark.parametrize("finetuning", ["lora", "full"])
def test_the_budget_probes_then_each_forward_takes_what_it_planned(tokenizer, row, monkeypatch, caplog, finetuning):
    """The probe on the row's prefix, then one forward of the whole row under three memory sizes: its measured peak
    stays within what the budget gave it, and within 25% of the rates' estimate; the more memory, the more layers
    kept; with little, layer inputs go to host memory. Full fine-tuning is the case an H100 caught: its gradients
    (a tenth of a forward's peak here) appear late in backward, and a probe that let them in read too low a slope."""
    model = llama(tokenizer, LAYERS, finetuning, "plain")
    trained = [p for p in model.parameters() if p.requires_grad]
    gradients = sum(p.nbytes for p in trained)
    device = MeteredDevice(monkeypatch, capacity=0)
    budget = ForwardBudget(torch.device("cpu"), checkpointed_layers(model))
    with device.meter:
        budget.probe(row, functools.partial(forward_and_backward, model), model.parameters())
        rates = budget.rates
        assert rates.kept_extra > 4 * rates.offload_saving > 0 and rates.recomputed > rates.offload_saving * LAYERS
        assert rates.offload_saving == pytest.approx(64 * 4)  # a layer's input: hidden 64, float32
        assert all(p.grad is None for p in trained)  # the probe leaves no gradients
        chosen = {}
        tokens = row["input_ids"].shape[1]
        for per_token in (rates.recomputed - 2.5 * rates.offload_saving, rates.recomputed + 2 * rates.kept_extra,
                          rates.recomputed + 8 * rates.kept_extra):
            available = budget.fixed + gradients + per_token * tokens  # fixed bytes, gradients and this rate
            device.capacity = device.meter.current[DEVICE] + int(available / (1 - HEADROOM))
            budget.limit = None
            with caplog.at_level("INFO", logger="tunesmith.train.forward_budget"):
                splits = budget.splits({"cu_seq_lens_q": torch.tensor([0, tokens])}, optimizer_ready=True)
                budget.prepare(tokens)
            assert splits in (None, [0, tokens])  # one conversation: one forward, however long
            modes = choose_modes(tokens, budget.available, rates, LAYERS)
            peak = device.peak_of(functools.partial(forward_and_backward, model, row))
            for parameter in trained:
                parameter.grad = None
            planned = budget.fixed + gradients + estimate(tokens, rates, modes)
            assert peak <= available, (modes, peak, planned)
            assert peak == pytest.approx(planned, rel=0.25), (modes, peak, planned)
            chosen[per_token] = modes
    kept = [m.kept for m in chosen.values()]
    assert kept == sorted(kept) and kept[-1] == LAYERS and kept[0] == 0
    assert list(chosen.values())[0].offloaded > 0
    assert "forwards of at most" in caplog.text and "recomputed" in caplog.text


@pytest.mark.heavy  # one long forward timed (~2 min loaded); the probe's other tests are seconds; -m heavy
def test_the_probe_reads_the_rate_of_a_long_forward_when_gradients_are_large(monkeypatch):
    """What an H100 caught, at this CPU's scale: full fine-tuning of a model whose gradients (96 MB) outweigh what a
    probe-sized forward's loss takes (64 KB a token over a 4,096-token vocabulary), so the probes' peaks come from
    the end of backward, when every gradient is held, and a 8,192-token forward's from the loss's backward. The
    probe's rates must still predict that forward's peak: at most 25% over it, never under."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from tunesmith.models.attention import use_varlen_attention

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=4096, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=8192,
                         tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32).train()
    use_varlen_attention(model)
    model.activation_checkpointing_enable()
    lengths = [512] * 16
    examples = [{"input_ids": torch.randint(0, 4096, (n,)).tolist(), "labels": torch.randint(0, 4096, (n,)).tolist()}
                for n in lengths]
    row = PackingCollator()(examples)
    gradients = sum(p.nbytes for p in model.parameters())
    device = MeteredDevice(monkeypatch, capacity=0)
    budget = ForwardBudget(torch.device("cpu"), checkpointed_layers(model))
    with device.meter:
        budget.probe(row, functools.partial(forward_and_backward, model), model.parameters())
        set_layer_modes(budget.layers, LayerModes(0, 2, 0), "cpu")
        peak = device.peak_of(functools.partial(forward_and_backward, model, row))
    tokens = sum(lengths)
    planned = budget.fixed + gradients + tokens * budget.rates.recomputed
    assert planned >= peak and planned == pytest.approx(peak, rel=0.25), (planned, peak)


@pytest.mark.parametrize(("fused_head_vocab", "tiled"), [(0, False), (1000, False), (200_000, True)])
def test_the_probe_takes_its_rows_loss_path_whatever_its_sizes(tokenizer, row, monkeypatch, fused_head_vocab, tiled):
    """Each of the probe's forwards asks for the tiled head where the row it is cut from takes it (the row's trained
    positions x the vocabulary over FUSED_HEAD_ELEMENTS), however few its own logits: a probe straddling that size read
    a slope of 0 on a large vocabulary. Where the row's logits stay whole, or the model has no tiled head, none asks."""
    from tunesmith.train.head_loss import FUSED_HEAD

    model = llama(tokenizer, LAYERS, "lora", "plain")
    device = MeteredDevice(monkeypatch, capacity=0)
    asked = []

    def run(part):
        asked.append(part.get(FUSED_HEAD, False))
        forward_and_backward(model, {k: v for k, v in part.items() if k != FUSED_HEAD})

    budget = ForwardBudget(torch.device("cpu"), checkpointed_layers(model), fused_head_vocab)
    with device.meter:
        budget.probe(row, run, model.parameters())
    assert asked == [tiled] * 3
    assert budget.rates.recomputed >= LAYERS * budget.rates.offload_saving > 0


@pytest.mark.parametrize("fixed_seconds", [0.0, 0.13])
def test_a_row_runs_the_fastest_way_the_probe_timed(fixed_seconds):
    """A 3,792-token row of three conversations where a forward keeping every layer holds 1,600 tokens (the H100's
    1.07B QLoRA under a 5.3 GiB cap): three forwards keeping their layers, or one recomputing most. With no fixed
    cost a forward, the three win (no recomputation); at the H100's 0.13 s a forward (kernel launches, every 4-bit
    weight dequantized again), one forward does, and its modes still fit."""
    from tunesmith.train.forward_budget import ForwardSeconds

    layers = 16
    budget = ForwardBudget(torch.device("cpu"), [torch.nn.Identity() for _ in range(layers)])
    budget.rates = LayerRates(recomputed=0.46e6, kept_extra=0.12e6, offload_saving=4096.0)
    budget.available = 3.8e9
    budget.seconds = ForwardSeconds(fixed=fixed_seconds, token=11e-6 * 4 / 3)
    lengths = [1200, 1300, 1292]
    limit = budget.rates.tokens_kept(budget.available, layers)
    assert limit < 3792
    splits = budget._fastest_splits(lengths, limit)
    if fixed_seconds:
        assert splits == [0, 3792]
        modes = choose_modes(3792, budget.available, budget.rates, layers)
        assert modes.fits and 0 < modes.kept < layers
    else:
        assert splits == [0, 1200, 2500, 3792]
