"""The specnode CLI as a user runs it: real text from the real model, and clear errors
(never a crash) for bad files, prompts and parameters."""
import json
import os
import re
import subprocess

import pytest


def run(cmd, timeout=600):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def assert_clean_error(res, *needles):
    """Failed with exit 1 or 2, not a signal, and stderr names the problem."""
    assert res.returncode in (1, 2), (res.returncode, res.stderr)
    for needle in needles:
        assert needle in res.stderr, res.stderr


def test_help_lists_commands(specnode):
    res = run([specnode, "--help"])
    assert res.returncode == 0
    for cmd in ("generate", "tokenize", "logits", "bench", "tiny-model"):
        assert cmd in res.stdout


def test_unknown_command_and_option(specnode, tiny_model):
    assert_clean_error(run([specnode, "frobnicate"]), "unknown command")
    assert_clean_error(run([specnode, "generate", "--model", tiny_model, "--promt", "x"]),
                       "unknown option --promt")


def test_named_chat_template_replaces_the_files(specnode, tiny_model):
    """--chat-template NAME formats chat prompts with a built-in template instead of the
    file's (the tiny model's is ChatML); an unknown name is refused before loading."""
    enc = run([specnode, "tokenize", "--model", tiny_model, "--text", "hi", "--chat",
               "--chat-template", "gemma"])
    assert enc.returncode == 0, enc.stderr
    ids = json.loads(enc.stdout)["ids"]
    dec = run([specnode, "tokenize", "--model", tiny_model, "--special", "--decode",
               ",".join(map(str, ids))])
    assert dec.returncode == 0, dec.stderr
    assert json.loads(dec.stdout)["text"] == \
        "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
    gen = run([specnode, "generate", "--model", tiny_model, "--prompt", "hi", "--chat",
               "--chat-template", "gemma", "--max-tokens", "2", "--json", "--quiet"])
    assert gen.returncode == 0, gen.stderr
    assert_clean_error(run([specnode, "generate", "--model", tiny_model, "--prompt", "hi",
                            "--chat", "--chat-template", "alpaca"]),
                       "--chat-template: unknown chat template \"alpaca\"")
    assert_clean_error(run([specnode, "tokenize", "--model", tiny_model, "--text", "hi",
                            "--chat-template", "gemma"]), "--chat-template needs --chat")


def test_tokenize_messages_renders_a_conversation(specnode, tiny_model):
    """--messages renders a whole conversation with the chat template (the tiny model's is
    ChatML) and reports the rendered prompt; --chat reports it too; bad conversations get a
    usage error naming the problem."""
    convo = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
             {"role": "assistant", "content": "yo"}, {"role": "user", "content": "bye"}]
    enc = run([specnode, "tokenize", "--model", tiny_model, "--messages", json.dumps(convo)])
    assert enc.returncode == 0, enc.stderr
    reply = json.loads(enc.stdout)
    want = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\nyo<|im_end|>\n<|im_start|>user\nbye<|im_end|>\n"
            "<|im_start|>assistant\n")
    assert reply["prompt"] == want
    dec = run([specnode, "tokenize", "--model", tiny_model, "--special", "--decode",
               ",".join(map(str, reply["ids"]))])
    assert json.loads(dec.stdout)["text"] == want
    one = run([specnode, "tokenize", "--model", tiny_model, "--text", "hi", "--chat"])
    assert json.loads(one.stdout)["prompt"].endswith("<|im_start|>user\nhi<|im_end|>\n"
                                                    "<|im_start|>assistant\n")
    assert "prompt" not in json.loads(run([specnode, "tokenize", "--model", tiny_model,
                                           "--text", "hi"]).stdout)
    # What the chat API takes, the CLI takes (one parser, node/serve/openai_api.h): OpenAI's
    # "developer" role is the system role, and content may be text parts.
    parts = [{"role": "developer", "content": "Be brief."},
             {"role": "user", "content": [{"type": "text", "text": "hi"}]},
             {"role": "assistant", "content": "yo"}, {"role": "user", "content": "bye"}]
    same = run([specnode, "tokenize", "--model", tiny_model, "--messages", json.dumps(parts)])
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout)["prompt"] == want
    for bad, msg in [("[", "--messages: 'messages' is not valid JSON"),
                     ("[]", "'messages' must be an array of 1..256 messages"),
                     ('[{"role": "user"}]', "--messages: messages[0] must be"),
                     ('[{"role": "tool", "content": "x"}]',
                      "messages[0].role must be system, user or assistant"),
                     ('[{"role": "user", "content": [{"type": "image_url"}]}]',
                      "messages[0].content: only text parts")]:
        assert_clean_error(run([specnode, "tokenize", "--model", tiny_model, "--messages", bad]),
                           msg)
    assert_clean_error(run([specnode, "tokenize", "--model", tiny_model, "--text", "a",
                            "--messages", "[]"]), "exactly one of --text, --decode and --messages")


def test_generate_on_tiny_model_is_deterministic(specnode, tiny_model):
    cmd = [specnode, "generate", "--model", tiny_model, "--prompt", "hello there",
           "--max-tokens", "12", "--temperature", "0.9", "--seed", "5", "--ignore-eos",
           "--json", "--quiet"]
    a = json.loads(run(cmd).stdout.strip().splitlines()[-1])
    b = json.loads(run(cmd).stdout.strip().splitlines()[-1])
    assert a["generated_ids"] == b["generated_ids"]
    assert len(a["generated_ids"]) == 12
    c = json.loads(run(cmd[:-4] + ["7", "--ignore-eos", "--json", "--quiet"]).stdout
                   .strip().splitlines()[-1])
    assert c["generated_ids"] != a["generated_ids"]


@pytest.mark.parametrize("args,needle", [
    (["--temperature", "-1"], "--temperature"),
    (["--temperature", "nan"], "--temperature"),
    (["--top-p", "0"], "top_p"),
    (["--top-p", "1.5"], "--top-p"),
    (["--top-k", "-3"], "--top-k"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["--max-tokens", "abc"], "--max-tokens"),
    (["--threads", "0"], "--threads"),
    (["--activations", "fp8"], "--activations: expected int16 or int8"),
    (["--device", "gpu"], '--device: expected cpu or cuda:N, got "gpu"'),
])
def test_invalid_sampling_and_limits(specnode, tiny_model, args, needle):
    res = run([specnode, "generate", "--model", tiny_model, "--prompt", "hi"] + args)
    assert_clean_error(res, needle)


def test_empty_and_overlong_prompts(specnode, tiny_model):
    assert_clean_error(run([specnode, "generate", "--model", tiny_model, "--prompt", ""]),
                       "empty")
    long_prompt = "word " * 2000  # the tiny model's context is 512 tokens
    assert_clean_error(run([specnode, "generate", "--model", tiny_model, "--prompt", long_prompt]),
                       "context length")
    assert_clean_error(run([specnode, "generate", "--model", tiny_model, "--prompt-ids",
                            "1,2,999999"]), "999999")


def test_bad_model_files(specnode, tmp_path):
    assert_clean_error(run([specnode, "generate", "--model", str(tmp_path / "missing.gguf"),
                            "--prompt", "x"]), "missing.gguf")
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"this is not a gguf file at all" * 10)
    assert_clean_error(run([specnode, "generate", "--model", str(garbage), "--prompt", "x"]),
                       "garbage.gguf")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    assert_clean_error(run([specnode, "generate", "--model", str(empty), "--prompt", "x"]),
                       "empty.gguf")


def test_truncated_real_model(specnode, real_model, tmp_path):
    with open(real_model, "rb") as f:
        head = f.read(5_000_000)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(head)
    assert_clean_error(run([specnode, "generate", "--model", str(cut), "--prompt", "x"]),
                       "cut.gguf")


def test_real_model_chat_is_coherent_english(specnode, real_model):
    res = run([specnode, "generate", "--model", real_model, "--chat", "--prompt",
               "What is the capital of France? Answer in one sentence.", "--max-tokens", "32",
               "--temperature", "0", "--json"])
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert "Paris" in summary["text"], summary["text"]
    assert "tokens/s" in res.stderr
    assert "loading" in res.stderr  # the load progress indication


def test_bench_json(specnode, tiny_model):
    res = run([specnode, "bench", "--model", tiny_model, "--batch", "1,4", "--prompt-tokens", "8",
               "--decode-tokens", "4", "--json"])
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert [r["batch"] for r in out["results"]] == [1, 4]
    assert all(r["decode_tokens_per_s"] > 0 for r in out["results"])
    assert out["activations"] == "int16"
    res = run([specnode, "bench", "--model", tiny_model, "--batch", "1", "--prompt-tokens", "8",
               "--decode-tokens", "3", "--verify", "1,3", "--json"])
    assert res.returncode == 0, res.stderr
    verify = json.loads(res.stdout.strip().splitlines()[-1])["verify"]
    assert [v["k"] for v in verify] == [1, 3]
    assert all(v["pass_s"] > 0 and v["one_token_step_s"] > 0 for v in verify)
    assert_clean_error(run([specnode, "bench", "--model", tiny_model, "--verify", "0"]), "--verify")


def test_device_cuda_without_a_gpu_is_a_clear_error(specnode, tiny_model):
    """--device cuda:N on a machine (or build) without CUDA fails cleanly, naming why; with
    a GPU it generates (the GPU forward pass is tested in cuda/tests/)."""
    res = run([specnode, "generate", "--model", tiny_model, "--prompt", "hi", "--max-tokens",
               "4", "--device", "cuda:0", "--json", "--quiet"])
    if res.returncode == 0:
        assert len(json.loads(res.stdout.strip().splitlines()[-1])["generated_ids"]) == 4
        return
    assert_clean_error(res)
    assert ("no CUDA device" in res.stderr or "without the CUDA backend" in res.stderr
            or "does not exist" in res.stderr), res.stderr


@pytest.mark.parametrize("args,needles", [
    # What no GPU does: refused naming the device.
    (["--kv-mode", "dense"], ("dense is the CPU's f32 reference cache", "without the CUDA backend")),
    (["--activations", "int8"], ("int16 blocks", "without the CUDA backend")),
])
def test_gpu_refusals_come_before_the_model_is_read(specnode, args, needles, tmp_path):
    """What a device cannot do is refused before any weight is read: the model path does
    not even exist here, and the error is the device's, not the file's."""
    missing = str(tmp_path / "not-there.gguf")
    res = run([specnode, "generate", "--model", missing, "--prompt", "hi", "--max-tokens", "1",
               "--device", "cuda:0", "--quiet"] + args)
    assert res.returncode == 1, res.stderr
    assert any(n in res.stderr for n in needles), res.stderr
    assert "not-there.gguf" not in res.stderr, res.stderr


@pytest.mark.parametrize("mode", ["mixed", "int8", "int4", "full"])
def test_every_kv_mode_passes_the_gpu_checks_then_needs_the_device(specnode, mode, tmp_path):
    """Every store mode is available on a GPU page pool: without a GPU (or a CUDA build) the
    only refusal is the missing device, still before any weight is read."""
    missing = str(tmp_path / "not-there.gguf")
    res = run([specnode, "generate", "--model", missing, "--prompt", "hi", "--max-tokens", "1",
               "--device", "cuda:0", "--quiet", "--kv-mode", mode])
    if res.returncode == 0:
        pytest.fail("generated from a model file that does not exist")
    assert "page pool" not in res.stderr, res.stderr
    assert ("no CUDA device" in res.stderr or "without the CUDA backend" in res.stderr
            or "not-there.gguf" in res.stderr), res.stderr


def test_kv_flags_override_single_fields(specnode, tiny_model):
    """--kv-* flags set their own field only: --kv-window keeps the default mode (mixed on
    the CPU), and the summary shows demoted tokens."""
    res = run([specnode, "generate", "--model", tiny_model, "--prompt", "hello " * 40,
               "--max-tokens", "8", "--temperature", "0", "--kv-window", "8", "--kv-sinks", "2"])
    assert res.returncode == 0, res.stderr
    assert "kv:" in res.stderr and "int4" in res.stderr, res.stderr
    m = re.search(r"f16 (\d+), int8 (\d+), int4 (\d+)", res.stderr)
    assert m, res.stderr
    assert int(m.group(2)) + int(m.group(3)) > 0, res.stderr


def test_int8_activations_generate_coherent_text(specnode, real_model):
    """--activations int8 (llama.cpp's rounding) on the real model: same facts, and the
    run reports which rounding it used."""
    res = run([specnode, "generate", "--model", real_model, "--prompt",
               "The capital of France is", "--temperature", "0", "--max-tokens", "8",
               "--activations", "int8", "--json", "--quiet"])
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert "Paris" in summary["text"], summary["text"]
    bench = run([specnode, "bench", "--model", real_model, "--batch", "1", "--prompt-tokens",
                 "8", "--decode-tokens", "2", "--activations", "int8", "--json"])
    assert bench.returncode == 0, bench.stderr
    # int8 where the CPU has an int8 kernel (AVX-512 VNNI), else the int16 path.
    assert json.loads(bench.stdout.strip().splitlines()[-1])["activations"] in ("int8", "int16")
