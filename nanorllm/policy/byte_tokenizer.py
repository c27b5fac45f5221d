"""The byte-level tokenizer of `tiny-random` and of the random-weight presets (policy/presets.py): built
in memory, every byte one token, ChatML special tokens. Its own module because both model sources
(policy/models.py, policy/presets.py) build it."""

from transformers import PreTrainedTokenizerFast

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_tokenizer(filler: int = 0) -> PreTrainedTokenizerFast:
    """Byte-level BPE with no merges (every byte is a token) plus ChatML special tokens; `filler` more
    tokens no text encodes to (a preset's vocabulary size), before the special ones."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab.update((f"<|filler_{i}|>", len(alphabet) + i) for i in range(filler))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|pad|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHATML_TEMPLATE
    return fast
