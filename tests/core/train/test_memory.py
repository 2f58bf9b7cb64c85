"""Activation memory counted, not timed (issue 40): the bytes a forward keeps for its backward, read with torch's
saved-tensor hooks on a small Llama (hidden 64, MLP 128, float32, the default model's 49,152-token vocabulary), with
and without activation checkpointing, with transformers' offloaded checkpointing, on a packed row and on a padded
batch of the same four conversations, through the logits and through the tiled head; then the offloaded run trains
exactly what the plain one does, and `--gradient_checkpointing offload` parses and resolves as documented.

How the count sees what it sees. Saved-tensor hooks nest, and the innermost active pair takes a tensor. torch's
non-reentrant checkpoint saves a layer's positional inputs (the hidden states) under the hooks active where the layer
is called, then runs the layer under hooks of its own that keep nothing (the layer is recomputed in backward): an outer
counting hook sees exactly what checkpointing keeps. transformers' `offload=True` wraps each checkpoint call in
`torch.autograd.graph.save_on_cpu`, whose hooks then sit between ours and the checkpoint's, so the layer inputs go to
save_on_cpu instead of to our hook. Every storage is counted once (several ops save the same tensor, or views of it);
the model's parameters are counted apart, as they are not activations."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

import pytest
import torch
import transformers.modeling_utils
from torch.autograd.graph import save_on_cpu
from transformers import AutoModelForCausalLM, LlamaConfig

from tests.core.data.test_packing import chat_examples
from tunesmith.data.collator import PackingCollator, PaddingCollator
from tunesmith.hparams import RUN_ARGUMENTS, SFTTrainingArguments, parse_run
from tunesmith.hparams.parser import Parser
from tunesmith.models.attention import use_varlen_attention
from tunesmith.train.head_loss import FUSED_HEAD, install_fused_head

HIDDEN, MLP = 64, 128
FLOAT32 = 4  # bytes


@pytest.fixture(scope="module")
def examples(tokenizer) -> list[dict]:
    """Four chat examples of uneven lengths (63, 96, 136 and 176 tokens), trained on the replies."""
    return chat_examples(tokenizer)


@pytest.fixture(scope="module")
def packed(examples) -> dict:
    """One padding-free row: the real tokens only, and logits only where the next token is trained."""
    return PackingCollator()(examples)


@pytest.fixture(scope="module")
def padded(examples, tokenizer) -> dict:
    """The same examples as rows padded to the longest."""
    return {**PaddingCollator(tokenizer.pad_token_id)(examples), "use_cache": False}


def llama(tokenizer, layers: int, finetuning: str = "full", checkpointing: str = "none") -> torch.nn.Module:
    """A random float32 Llama of `layers` layers (SmolLM2's architecture, build_tiny_model_dir's shape) on packed
    attention, the same weights for every call with the same layers; `finetuning` full or lora (r 4 on every linear
    layer); `checkpointing` none, plain or offload (transformers' activation_checkpointing_enable)."""
    from peft import LoraConfig, get_peft_model

    from tunesmith.models.loader import find_lora_targets

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=HIDDEN, intermediate_size=MLP,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    use_varlen_attention(model)
    if finetuning == "lora":
        lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=find_lora_targets(model))
        model = get_peft_model(model, lora)
    if checkpointing != "none":
        model.activation_checkpointing_enable(offload=checkpointing == "offload")
    return model.train()


@dataclass
class Storage:
    nbytes: int
    shapes: set[tuple[int, ...]]  # every shape it was saved as (views of one storage)
    dtype: torch.dtype
    parameter: str | None  # the model's parameter this is the storage of, if any
    device: str
    pinned: bool


@dataclass
class Saved:
    """What one forward kept for its backward, one entry per storage."""

    storages: list[Storage]
    packed: int  # tensors handed to the pack hook
    unpacked: int  # tensors the backward asked back

    @property
    def activation_bytes(self) -> int:
        return sum(s.nbytes for s in self.storages if s.parameter is None)

    def activations(self) -> Counter:
        """(first shape, dtype, bytes) of each activation storage that holds any bytes, as a multiset. (torch up to
        2.12 saves an empty placeholder beside a checkpoint's inputs, `_NoopSaveInputs`; 2.13 saves the inputs
        alone.)"""
        return Counter((min(s.shapes), s.dtype, s.nbytes) for s in self.storages if s.parameter is None and s.nbytes)


class StorageCounter:
    """A pack hook that notes each saved tensor's storage once (by address: the tensors are held until the count is
    read, so no address is reused for another storage meanwhile) and keeps the tensor as it is; an unpack counter."""

    def __init__(self, parameters: dict[int, str] | None = None) -> None:
        self.parameters = parameters or {}
        self.held: dict[tuple[str, int], tuple[torch.Tensor, set]] = {}
        self.packed = self.unpacked = 0

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        self.held.setdefault((tensor.device.type, storage.data_ptr()), (tensor, set()))[1].add(tuple(tensor.shape))
        self.packed += 1
        return tensor

    def unpack(self, tensor: torch.Tensor) -> torch.Tensor:
        self.unpacked += 1
        return tensor

    def result(self) -> Saved:
        storages = [Storage(t.untyped_storage().nbytes(), shapes, t.dtype, self.parameters.get(key[1]), key[0],
                            t.device.type == "cpu" and t.is_pinned())
                    for key, (t, shapes) in self.held.items()]
        self.held = {}
        return Saved(storages, self.packed, self.unpacked)


def saved_for_backward(model: torch.nn.Module, batch: dict, **kwargs) -> Saved:
    """One forward of `model` on `batch` under a counting saved-tensor hook, then its backward."""
    counter = StorageCounter({p.untyped_storage().data_ptr(): name for name, p in model.named_parameters()})
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
        loss = model(**batch, **kwargs).loss
    loss.backward()
    return counter.result()


@pytest.fixture(scope="module")
def saved(tokenizer, packed, padded):
    """saved(layers, finetuning, checkpointing, batch="packed"): saved_for_backward of that model on that batch,
    counted once for the module (the weights are the same for every call)."""
    batches, cache = {"packed": packed, "padded": padded}, {}

    def count(layers: int, finetuning: str = "full", checkpointing: str = "none", batch: str = "packed") -> Saved:
        key = (layers, finetuning, checkpointing, batch)
        if key not in cache:
            cache[key] = saved_for_backward(llama(tokenizer, layers, finetuning, checkpointing), batches[batch])
        return cache[key]

    return count


class CountingSaveOnCpu(save_on_cpu):
    """torch's save_on_cpu, counting the host copies it keeps (the copies, not the device tensors it is handed, which
    the count would otherwise keep alive): installed where transformers' offloaded checkpointing looks it up
    (transformers.modeling_utils imports the name from torch.autograd.graph and calls it around each checkpointed
    layer). Pinned memory needs an accelerator's allocator: on a machine without one this asks for unpinned copies (a
    CPU tensor's `.cpu()` is the tensor itself), where transformers' own pin_memory=True fails in the first forward."""

    calls: list[dict] = []
    counter: StorageCounter | None = None

    def __init__(self, pin_memory: bool = False, device_type: str = "cuda") -> None:
        type(self).calls.append({"pin_memory": pin_memory, "device_type": device_type})
        super().__init__(pin_memory=pin_memory and torch.accelerator.is_available(), device_type=device_type)
        self._pack, self._unpack = self.pack_hook, self.unpack_hook
        self.pack_hook, self.unpack_hook = self.counted_pack, self.counted_unpack

    def counted_pack(self, tensor: torch.Tensor) -> tuple[torch.device, torch.Tensor]:
        device, copy = self._pack(tensor)
        return device, self.counter.pack(copy)

    def counted_unpack(self, packed: tuple[torch.device, torch.Tensor]) -> torch.Tensor:
        return self._unpack((packed[0], self.counter.unpack(packed[1])))


@pytest.fixture
def offload(monkeypatch) -> type[CountingSaveOnCpu]:
    monkeypatch.setattr(CountingSaveOnCpu, "calls", [])
    monkeypatch.setattr(CountingSaveOnCpu, "counter", StorageCounter())
    monkeypatch.setattr(transformers.modeling_utils, "save_on_cpu", CountingSaveOnCpu)
    return CountingSaveOnCpu


def layer_inputs(rows: int, positions: int, layers: int) -> Counter:
    """What checkpointing keeps for `layers` layers: each one's input hidden states, [rows, positions, hidden]."""
    return Counter({((rows, positions, HIDDEN), torch.float32, rows * positions * HIDDEN * FLOAT32): layers})


@pytest.mark.parametrize("finetuning", ["full", "lora"])
def test_checkpointing_keeps_each_layers_input_only(saved, packed, finetuning):
    """Checkpointed, a layer keeps its input hidden states and nothing else: two more layers keep exactly two more
    [1, tokens, hidden] float32 tensors (256 bytes a token each here). The rest (the embedding's indices, the final
    norm, the head's input and the loss's log-softmax of the trained positions) does not depend on the layers."""
    tokens = packed["input_ids"].shape[1]
    two, four = saved(2, finetuning, "plain"), saved(4, finetuning, "plain")
    assert four.activations() - two.activations() == layer_inputs(1, tokens, 2)
    assert two.activations() - four.activations() == Counter()
    assert four.activation_bytes - two.activation_bytes == 2 * tokens * HIDDEN * FLOAT32
    assert two.unpacked == two.packed  # the backward read back every tensor kept, once


@pytest.mark.parametrize("finetuning", ["full", "lora"])
def test_without_checkpointing_each_layer_keeps_many_times_more(saved, packed, finetuning):
    """Not checkpointed, a layer keeps every Linear's input (q/k/v's and gate/up's normed states, o_proj's attention
    output: 3 x hidden; down_proj's: mlp) and the MLP's gate output and both factors of its product (3 x mlp): at
    least 3 x hidden + 4 x mlp floats a token, 11 times the checkpointed layer's hidden (measured: about 18 times in
    full fine-tuning, 16.5 with LoRA, the attention's and norms' own tensors besides)."""
    tokens = packed["input_ids"].shape[1]
    per_layer = (saved(4, finetuning).activation_bytes - saved(2, finetuning).activation_bytes) / 2
    assert per_layer >= (3 * HIDDEN + 4 * MLP) * FLOAT32 * tokens
    assert per_layer >= 11 * HIDDEN * FLOAT32 * tokens


@pytest.mark.parametrize("finetuning", ["full", "lora"])
def test_offloaded_checkpointing_hands_the_layer_inputs_to_save_on_cpu(tokenizer, saved, packed, offload, finetuning):
    """With transformers' offload the layer inputs go through save_on_cpu (asked for with pinned memory) and nothing
    else does: it packs exactly the checkpointed layers' inputs and hands each back once in backward, and what the
    forward keeps outside it no longer depends on the layers: the plain checkpointed count less the layer inputs."""
    tokens = packed["input_ids"].shape[1]
    plain = saved(4, finetuning, "plain")
    kept = {}
    for layers in (2, 4):
        offload.counter = StorageCounter()
        kept[layers] = saved_for_backward(llama(tokenizer, layers, finetuning, "offload"), packed)
        offloaded = offload.counter.result()
        assert offloaded.activations() == layer_inputs(1, tokens, layers)
        assert offloaded.activation_bytes == layers * tokens * HIDDEN * FLOAT32
        assert offloaded.packed == offloaded.unpacked
    assert kept[4].activations() == kept[2].activations() == plain.activations() - layer_inputs(1, tokens, 4)
    assert kept[4].activation_bytes == plain.activation_bytes - 4 * tokens * HIDDEN * FLOAT32
    assert offload.calls and all(call["pin_memory"] for call in offload.calls)


def test_a_packed_row_keeps_real_tokens_a_padded_batch_every_position(saved, packed, padded):
    """Checkpointed, a layer keeps one hidden state per position it computes: a packed row its 471 real tokens, the
    padded batch 4 rows x 176 (the longest), 704 positions: half as much again for these four conversations."""
    lengths = [int(n) for n in (packed["cu_seq_lens_q"][1:] - packed["cu_seq_lens_q"][:-1])]
    rows, longest = padded["input_ids"].shape
    assert (rows, longest, packed["input_ids"].shape[1]) == (4, max(lengths), sum(lengths))
    for batch, shape in (("packed", (1, sum(lengths))), ("padded", (rows, longest))):
        two, four = saved(2, "full", "plain", batch), saved(4, "full", "plain", batch)
        assert four.activations() - two.activations() == layer_inputs(*shape, 2)
        assert four.activation_bytes - two.activation_bytes == 2 * shape[0] * shape[1] * HIDDEN * FLOAT32


def vocabulary_sized(saved: Saved, vocab: int) -> tuple[list[tuple[int, ...]], list[str]]:
    """The shapes of the saved tensors with a dimension as long as the vocabulary that are no parameter, and the names
    of the parameters saved with such a dimension."""
    shapes = sorted(shape for s in saved.storages if s.parameter is None for shape in s.shapes if vocab in shape)
    parameters = sorted(s.parameter for s in saved.storages if s.parameter and any(vocab in x for x in s.shapes))
    return shapes, parameters


def test_the_tiled_head_keeps_nothing_vocabulary_sized(tokenizer, saved, packed):
    """Through the logits, the loss keeps the log-softmax of the trained positions, [trained, vocabulary] float32 (about
    18 MB for these 90 positions: 196 KB a trained token); through the tiled head (head_loss.py) nothing of the
    vocabulary's size is kept but the head's weight itself (the tied embedding), and the head's share is its
    [trained, hidden] input and a few numbers per position."""
    vocab, trained = len(tokenizer), packed["logits_to_keep"].numel()
    model = llama(tokenizer, 2, checkpointing="plain")
    head = [name for name, p in model.named_parameters() if p is model.get_output_embeddings().weight]
    assert head == ["model.embed_tokens.weight"]  # tied: one parameter, named once
    logits = saved(2, "full", "plain")
    assert vocabulary_sized(logits, vocab) == ([(trained, vocab)], head)
    assert install_fused_head(model)
    tiled = saved_for_backward(model, packed, **{FUSED_HEAD: True})
    assert vocabulary_sized(tiled, vocab) == ([], head)
    assert logits.activation_bytes - tiled.activation_bytes >= trained * vocab * FLOAT32 - trained * HIDDEN * FLOAT32


def loss_and_gradients(model: torch.nn.Module, batch: dict, **kwargs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss = model(**batch, **kwargs).loss
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("fused", [False, True], ids=["logits", "tiled-head"])
def test_an_offloaded_run_trains_what_the_plain_run_trains(tokenizer, packed, offload, fused):
    """The same packed batch through the same weights: not checkpointed, checkpointed, and checkpointed with the
    layer inputs through save_on_cpu give the same loss and gradients (every parameter's)."""
    results = {}
    for checkpointing in ("none", "plain", "offload"):
        model = llama(tokenizer, 4, checkpointing=checkpointing)
        if fused:
            assert install_fused_head(model)
        results[checkpointing] = loss_and_gradients(model, packed, **({FUSED_HEAD: True} if fused else {}))
    # the offloaded run did offload, one hidden state a layer
    assert offload.counter.result().activations() == layer_inputs(1, packed["input_ids"].shape[1], 4)
    reference_loss, reference = results["none"]
    for checkpointing in ("plain", "offload"):
        loss, grads = results[checkpointing]
        assert torch.equal(loss, reference_loss), checkpointing
        assert grads.keys() == reference.keys()
        for name, grad in grads.items():
            assert torch.allclose(grad, reference[name], rtol=0, atol=1e-6), f"{checkpointing}: {name}"


def test_gradient_checkpointing_offload_checkpoints_without_offloading_on_cpu(tmp_path, caplog):
    """On CPU the activations already live in host memory: `offload` is plain checkpointing, said once in the log,
    with no offload argument for transformers (whose pinned copies need an accelerator)."""
    with caplog.at_level(logging.INFO, logger="tunesmith.hparams.training_args"):
        args = SFTTrainingArguments(output_dir=str(tmp_path), gradient_checkpointing="offload", use_cpu=True)
    assert args.gradient_checkpointing is True and args.activation_checkpointing is True
    assert "offload" not in (args.activation_checkpointing_kwargs or {})
    assert "offload" not in (args.gradient_checkpointing_kwargs or {})
    assert "checkpointing without offloading" in caplog.text
    run = parse_run("sft", ["--data_path", "x.jsonl", "--gradient_checkpointing", "offload", "--output_dir",
                            str(tmp_path)], check_paths=False)
    assert run.training.gradient_checkpointing is True
    offloads = (run.training.activation_checkpointing_kwargs or {}).get("offload", False)
    assert offloads == (not run.training.use_cpu)  # by default on CPU where no GPU is found, offloading where one is


@pytest.mark.skipif(not torch.cuda.is_available(), reason="offloading applies where a GPU trains")
def test_gradient_checkpointing_offload_asks_transformers_to_offload_on_a_gpu(tmp_path):
    args = SFTTrainingArguments(output_dir=str(tmp_path), gradient_checkpointing="offload", use_cpu=False)
    assert args.gradient_checkpointing is True and args.activation_checkpointing is True
    assert args.activation_checkpointing_kwargs == {"offload": True}


def test_the_gradient_checkpointing_flag_takes_true_false_offload_or_auto(capsys):
    parser = Parser(RUN_ARGUMENTS["sft"])
    for argv, value in ((["--gradient_checkpointing", "offload"], "offload"), (["--gradient_checkpointing"], True),
                        (["--gradient_checkpointing", "auto"], "auto"),
                        (["--gradient_checkpointing", "false"], False), ([], None)):
        assert parser.parse_known_args(argv)[0].gradient_checkpointing == value, argv
        assert type(parser.parse_known_args(argv)[0].gradient_checkpointing) is type(value), argv
    with pytest.raises(SystemExit) as stopped:
        parser.parse_known_args(["--gradient_checkpointing", "maybe"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert "argument --gradient_checkpointing" in error and "'maybe': give true, false, offload or auto" in error


@pytest.mark.skipif(not torch.cuda.is_available(), reason="offloading applies where a GPU trains")
def test_on_a_gpu_offloading_moves_the_layer_inputs_to_pinned_host_memory(tokenizer, packed, offload):
    """A model on CUDA, checkpointed, then checkpointed with offload: the offloaded run keeps each layer's input as a
    pinned host copy, holds exactly that much less GPU memory between its forward and its backward (the caching
    allocator rounds each block up to 512 bytes), and gives the same loss and gradients."""
    tokens = packed["input_ids"].shape[1]
    batch = {key: value.cuda() if torch.is_tensor(value) else value for key, value in packed.items()}
    llama(tokenizer, 4).cuda()(**batch).loss.backward()  # once first: cuBLAS's 32 MiB workspace is allocated then
    held, results = {}, {}
    for checkpointing in ("plain", "offload"):
        model = llama(tokenizer, 4, checkpointing=checkpointing).cuda()
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        loss = model(**batch).loss
        torch.cuda.synchronize()
        held[checkpointing] = torch.cuda.memory_allocated() - before
        loss.backward()
        results[checkpointing] = loss.detach().cpu(), {n: p.grad.cpu() for n, p in model.named_parameters()}
        del model, loss
    copies = offload.counter.result()
    assert copies.activations() == layer_inputs(1, tokens, 4)
    assert all(s.device == "cpu" and s.pinned for s in copies.storages if s.nbytes)
    assert copies.packed == copies.unpacked
    block = -(-tokens * HIDDEN * FLOAT32 // 512) * 512
    assert held["plain"] - held["offload"] == 4 * block, held
    (plain_loss, plain), (offloaded_loss, offloaded) = results["plain"], results["offload"]
    assert torch.equal(offloaded_loss, plain_loss)
    for name, grad in offloaded.items():
        assert torch.allclose(grad, plain[name], rtol=0, atol=1e-6), name
