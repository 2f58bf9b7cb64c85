"""Tiny random models around the real SmolLM2 tokenizer (the fast tier), a SentencePiece-style tokenizer trained on
the demo data, and random LoRA adapters."""

from __future__ import annotations

import torch

from tests.helpers.paths import ROOT


def build_tiny_model_dir(path, tokenizer, hidden_size: int = 64, layers: int = 2, seed: int = 0, **overrides) -> str:
    """A random LlamaForCausalLM (SmolLM2's architecture) with the real tokenizer, saved like a
    normal HF model directory; `overrides` sets LlamaConfig fields."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def build_spm_tokenizer(add_prefix: bool, vocab_size: int = 1500):
    """A SentencePiece-style tokenizer (BPE with byte fallback, spaces as ▁, as HF converts Llama 2's and
    Gemma's), trained here on the demo SFT data since none can be downloaded: add_prefix puts a ▁ before the
    text and BOS first (Llama 2), without it neither (Gemma); ChatML special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from tunesmith.data.template import BUILTIN_TEMPLATES

    space = "\u2581"
    specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"] + [f"<0x{i:02X}>" for i in range(256)]
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence(([normalizers.Prepend(space)] if add_prefix else [])
                                          + [normalizers.Replace(" ", space)])
    tok.decoder = decoders.Sequence([decoders.Replace(space, " "), decoders.ByteFallback(), decoders.Fuse()]
                                    + ([decoders.Strip(" ", 1, 0)] if add_prefix else []))
    corpus = (ROOT / "data" / "demo" / "sft.jsonl").read_text(encoding="utf-8").splitlines()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                        show_progress=False))
    if add_prefix:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="<|im_end|>", unk_token="<unk>",
                                   pad_token="</s>", additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.chat_template = BUILTIN_TEMPLATES["chatml"].read_text()
    return fast


def save_random_adapter(model_dir: str, tokenizer, out: str, seed: int) -> str:
    """A LoRA adapter (r 4, every linear layer) with random B as well as A, so it changes the model's
    answers, saved with the tokenizer to `out`."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tunesmith.models.loader import find_lora_targets

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = LoraConfig(r=4, lora_alpha=32, target_modules=find_lora_targets(model), init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out

