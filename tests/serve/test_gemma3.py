"""Gemma 3 270M (the second real model: gemma3 architecture, SentencePiece vocabulary,
Q4_K_M file without a chat template) the way users run it: `specnode generate` in every KV
mode and with speculation, and `specnode serve` over ZeroMQ with raw prompts and, with a
named template, chat. Greedy tokens against the NumPy oracle: tests/oracle/test_gemma3*.py.

A prompt longer than the 512-token window of the local layers runs through the windowed
attention of the paged store (docs/model-engine.md)."""
import json
import subprocess

import pytest

from serve_helpers import Node
from specnode_client import SpecnodeClient, SpecnodeError

PROMPT = "The capital of France is"
# ~700 tokens: every local layer's window (512) is exceeded by the end.
LONG_PROMPT = " ".join(["The lighthouse keeper climbed the stairs every evening, lit the lamp and"
                        " wrote the weather into the log book before the ships came past."] * 24)


def generate(specnode, model, prompt, *extra, max_tokens=16):
    res = subprocess.run([specnode, "generate", "--model", model, "--prompt", prompt,
                          "--max-tokens", str(max_tokens), "--temperature", "0", "--json",
                          "--quiet", "--threads", "2", *extra],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_generate_raw_prompt(specnode, gemma_model):
    out = generate(specnode, gemma_model, PROMPT)
    assert out["prompt_ids"][0] == 2, "Gemma's <bos> is added"
    assert len(out["generated_ids"]) == 16
    assert "France" in out["text"] or "Paris" in out["text"], out["text"]


@pytest.mark.parametrize("kv_mode", ["dense", "full", "int8", "int4", "mixed"])
def test_every_kv_mode_past_the_window(specnode, gemma_model, kv_mode):
    """Each KV mode runs a prompt past the 512-token window; the precise modes agree with
    the f32 reference on the greedy continuation, the quantised ones on its first token."""
    ref = generate(specnode, gemma_model, LONG_PROMPT, "--kv-mode", "dense", max_tokens=8)
    assert len(ref["prompt_ids"]) > 600, len(ref["prompt_ids"])
    out = generate(specnode, gemma_model, LONG_PROMPT, "--kv-mode", kv_mode, max_tokens=8)
    agree = 8 if kv_mode in ("dense", "full") else 1
    assert out["generated_ids"][:agree] == ref["generated_ids"][:agree], (kv_mode, out["text"],
                                                                          ref["text"])


@pytest.mark.parametrize("draft", ["ngram", "self:6"])
def test_speculation_keeps_greedy_tokens(specnode, gemma_model, draft):
    """Exact acceptance: greedy text with a drafter equals greedy text without, on a prompt
    that crosses the window while drafts are verified in blocks."""
    plain = generate(specnode, gemma_model, LONG_PROMPT, max_tokens=24)
    spec = generate(specnode, gemma_model, LONG_PROMPT, "--draft", draft, max_tokens=24)
    assert spec["generated_ids"] == plain["generated_ids"]
    assert spec["drafted"] > 0


def test_chat_needs_a_template(specnode, gemma_model):
    res = subprocess.run([specnode, "generate", "--model", gemma_model, "--prompt", "Hi",
                          "--chat", "--max-tokens", "4", "--quiet"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode != 0
    assert "no chat template" in res.stderr and "--chat-template" in res.stderr, res.stderr
    out = subprocess.run([specnode, "generate", "--model", gemma_model, "--prompt", "Hi",
                          "--chat", "--chat-template", "gemma", "--max-tokens", "4", "--quiet",
                          "--temperature", "0", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    ids = json.loads(out.stdout.strip().splitlines()[-1])["prompt_ids"]
    # <bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n
    assert ids[:2] == [2, 105], ids


def test_serve_raw_prompt_and_named_template_chat(specnode, gemma_model, tmp_path):
    want = generate(specnode, gemma_model, PROMPT, max_tokens=12)["text"]
    plain = Node(specnode, gemma_model, tmp_path / "serve.log", extra=["--threads", "2"])
    try:
        plain.wait_ready(timeout_s=180)
        with SpecnodeClient(plain.endpoint, timeout_s=300) as c:
            assert c.generate(prompt=PROMPT, max_tokens=12, temperature=0).text == want
            with pytest.raises(SpecnodeError) as err:
                c.generate(messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
            assert "chat template" in err.value.message, err.value
            # The node is still up and serving.
            assert c.generate(prompt=PROMPT, max_tokens=12, temperature=0).text == want
    finally:
        assert plain.stop() == 0, plain.log()
    chat = Node(specnode, gemma_model, tmp_path / "serve-chat.log",
                extra=["--threads", "2", "--chat-template", "gemma"])
    try:
        chat.wait_ready(timeout_s=180)
        with SpecnodeClient(chat.endpoint, timeout_s=300) as c:
            r = c.generate(messages=[{"role": "user", "content": "What is the capital of France?"}],
                           max_tokens=8, temperature=0)
            assert r.finish_reason in ("length", "stop"), r
    finally:
        assert chat.stop() == 0, chat.log()
