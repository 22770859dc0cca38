"""A reference tokenizer: HF `tokenizers` BPE rebuilt from a GGUF's vocab and merges.

Shares no code with the engine. Matches llama.cpp's "smollm" pre-tokenizer (GPT-2 byte
level BPE where every digit is its own pre-token). Control tokens (GGUF token type 3,
e.g. <|im_start|>) are registered as special tokens so they are recognised in text.
"""

from __future__ import annotations

import functools

import gguf
import jinja2
import jinja2.sandbox
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

# The pre-tokenizer regex of Qwen2's tokenizer.json (llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN2).
QWEN2_PRE_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4


def _strings(reader: gguf.GGUFReader, key: str) -> list[str]:
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def _ints(reader: gguf.GGUFReader, key: str) -> list[int]:
    f = reader.fields[key]
    return [int(f.parts[i][0]) for i in f.data]


@functools.lru_cache(maxsize=4)
def load_gguf_tokenizer(path: str) -> "GGUFTokenizer":
    return GGUFTokenizer(path)


class GGUFTokenizer:
    def __init__(self, path: str):
        reader = gguf.GGUFReader(path)
        model = reader.fields["tokenizer.ggml.model"].contents()
        if model != "gpt2":
            raise ValueError(f"only gpt2-style BPE vocabularies are supported, got {model!r}")
        tokens = _strings(reader, "tokenizer.ggml.tokens")
        merges = [tuple(m.split(" ", 1)) for m in _strings(reader, "tokenizer.ggml.merges")]
        types = _ints(reader, "tokenizer.ggml.token_type") if "tokenizer.ggml.token_type" in reader.fields \
            else [1] * len(tokens)
        self.tokens = tokens
        self.bos_id = int(reader.fields["tokenizer.ggml.bos_token_id"].contents()) \
            if "tokenizer.ggml.bos_token_id" in reader.fields else None
        self.eos_id = int(reader.fields["tokenizer.ggml.eos_token_id"].contents()) \
            if "tokenizer.ggml.eos_token_id" in reader.fields else None
        self.chat_template = reader.fields["tokenizer.chat_template"].contents() \
            if "tokenizer.chat_template" in reader.fields else None

        pre = reader.fields["tokenizer.ggml.pre"].contents() \
            if "tokenizer.ggml.pre" in reader.fields else ""
        vocab = {tok: i for i, tok in enumerate(tokens)}
        tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        if pre == "qwen2":
            # Qwen2's tokenizer.json: one Split on its regex (digits one by one, "\n\n" one
            # piece), then ByteLevel without GPT-2's regex.
            tk.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(QWEN2_PRE_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ])
        else:
            tk.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ])
        tk.decoder = decoders.ByteLevel()
        special = [AddedToken(tokens[i], special=True, normalized=False)
                   for i, t in enumerate(types) if t in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)]
        tk.add_special_tokens(special)
        self.tk = tk

    def encode(self, text: str) -> list[int]:
        return self.tk.encode(text, add_special_tokens=False).ids

    def pieces(self, text: str) -> list[str]:
        return self.tk.encode(text, add_special_tokens=False).tokens

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(self, user_text: str) -> str:
        """The GGUF's chat template applied to one user message, with the generation prompt."""
        return self.render_messages([{"role": "user", "content": user_text}])

    def render_messages(self, messages: list[dict]) -> str:
        """The GGUF's chat template applied to a conversation with the generation prompt, as
        transformers' apply_chat_template renders it (a sandboxed Jinja2 environment with
        trim_blocks / lstrip_blocks, no tools)."""
        if not self.chat_template:
            raise ValueError("GGUF has no tokenizer.chat_template")
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        env.globals["raise_exception"] = raise_exception
        tmpl = env.from_string(self.chat_template)
        return tmpl.render(messages=messages, tools=None, add_generation_prompt=True,
                           bos_token=self.tokens[self.bos_id] if self.bos_id is not None else "",
                           eos_token=self.tokens[self.eos_id] if self.eos_id is not None else "")

    def encode_chat(self, user_text: str) -> list[int]:
        return self.encode(self.render_chat(user_text))
