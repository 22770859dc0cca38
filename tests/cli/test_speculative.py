"""Speculative decoding as users run it: `specnode generate --draft ...` and
`specnode spec-bench`, on tiny models (always) and on SmolLM2 (when the model is present)."""
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(cmd, timeout=900):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def last_json(res):
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tiny_pair(specnode, tmp_path_factory):
    """A 3-layer tiny target, a lightly perturbed draft of it, and a model with another
    vocabulary."""
    d = tmp_path_factory.mktemp("spec")
    paths = {}
    for name, extra in (("target", []), ("draft", ["--perturb", "0.05"]),
                        ("othervocab", ["--merges", "40"])):
        paths[name] = str(d / f"{name}.gguf")
        subprocess.run([specnode, "tiny-model", "--out", paths[name], "--layers", "3",
                        "--type", "q8_0"] + extra, check=True)
    return paths


@pytest.mark.parametrize("draft", ["DRAFT", "self:1", "self:2", "ngram", "ngram:2"])
def test_generate_with_draft_equals_target_only(specnode, tiny_pair, draft):
    draft = tiny_pair["draft"] if draft == "DRAFT" else draft
    base = [specnode, "generate", "--model", tiny_pair["target"], "--prompt",
            "the cat sat on the mat and the cat sat on the", "--max-tokens", "40",
            "--temperature", "0", "--ignore-eos", "--json", "--quiet", "--kv-mode", "full"]
    want = last_json(run(base))
    got_res = run(base + ["--draft", draft, "--spec-k", "5"])
    got = last_json(got_res)
    assert got["generated_ids"] == want["generated_ids"]
    assert got["drafter"]
    assert "speculation (" in got_res.stderr
    if draft == tiny_pair["draft"]:
        assert got["acceptance"] > 0.5
        assert got["target_passes"] < 40


@pytest.mark.parametrize("args,needle", [
    (["--draft", "self:0"], "positive integer"),
    (["--draft", "self:3"], "self-draft layers"),
    (["--draft", "self:x"], "positive integer"),
    (["--draft", "ngram:0"], "positive integer"),
    (["--draft", "/nonexistent/draft.gguf"], "draft.gguf"),
    (["--draft", "OTHER"], "vocabulary"),
    (["--draft", "ngram", "--spec-k", "0"], "--spec-k"),
    (["--draft", "ngram", "--domain", "bad domain!"], "domain"),
])
def test_bad_speculation_flags(specnode, tiny_pair, args, needle):
    args = [tiny_pair["othervocab"] if a == "OTHER" else a for a in args]
    res = run([specnode, "generate", "--model", tiny_pair["target"], "--prompt", "hi"] + args)
    assert res.returncode in (1, 2), res.stderr
    assert needle in res.stderr, res.stderr


def test_spec_bench_bad_prompt_file(specnode, tiny_pair, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"domain": "chat", "prompt": "fine"}\n{"domain": 3}\n')
    res = run([specnode, "spec-bench", "--model", tiny_pair["target"], "--prompts", str(bad)])
    assert res.returncode == 1 and "bad.jsonl:2" in res.stderr, res.stderr


def test_smollm2_greedy_speculation_matches_target_only(specnode, real_model):
    """On SmolLM2, every drafter (prompt lookup, a self-draft that is often rejected) with
    fixed and adaptive K, alone and behind the router, gives target-only greedy tokens on at
    least 9 of 10 prompts (the CPU kernels are batch-invariant, so all 10 are expected)."""
    prompts = sorted(str(p) for p in (ROOT / "bench/prompts").glob("*.jsonl"))
    assert len(prompts) >= 4
    res = run([specnode, "spec-bench", "--model", real_model, "--prompts", ",".join(prompts),
               "--per-domain", "3", "--max-tokens", "32", "--drafters", "ngram,self:26",
               "--threads", "2", "--kv-mode", "full", "--json"])
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    for config in result["configs"]:
        total = sum(d["prompts"] for d in config["domains"].values())
        same = sum(d["identical_to_target"] for d in config["domains"].values())
        assert total >= 10
        assert same >= total - max(1, total // 10), (config["name"], same, total)
        # One record per sequence: its prompt, the drafter the router chose (behind the
        # router only), its tokens and time, which add up to the domain's.
        for d in config["domains"].values():
            seqs = d["sequences"]
            assert len(seqs) == d["prompts"]
            assert sum(q["tokens"] for q in seqs) == d["tokens"]
            assert abs(sum(q["decode_s"] for q in seqs) - d["decode_s"]) < 1e-6
            routed = [q["drafter"] for q in seqs if q["drafter"]]
            assert len(routed) == (len(seqs) if config["name"] == "router" else 0), config["name"]
        assert len({q["prompt"] for d in config["domains"].values() for q in d["sequences"]}) \
            == total
    ngram = next(c for c in result["configs"] if c["name"] == "ngram:4 fixed")
    # Prompt lookup pays somewhere (code edits copy their input): more than one token per
    # target pass on its best domain, and accepted drafts in every copy-prone domain.
    assert max(d["tokens_per_pass"] for d in ngram["domains"].values()) > 1.2
    assert ngram["domains"]["code"]["accepted"] > 0
    assert ngram["domains"]["summarize"]["accepted"] > 0


def test_spec_bench_stops_at_end_of_generation(specnode, real_model, tmp_path):
    """spec-bench decodes what a served request would: up to the end-of-generation token
    (the tokens `generate` prints), unless --ignore-eos asks for max-tokens every time."""
    prompts = tmp_path / "short.jsonl"
    prompts.write_text(json.dumps({"domain": "chat",
                                   "prompt": "What is the capital of France?"}) + "\n")
    base = [specnode, "spec-bench", "--model", real_model, "--prompts", str(prompts),
            "--per-domain", "1", "--max-tokens", "48", "--drafters", "ngram", "--threads", "2",
            "--kv-mode", "full", "--json"]
    want = last_json(run([specnode, "generate", "--model", real_model, "--chat", "--prompt",
                          "What is the capital of France?", "--max-tokens", "48",
                          "--temperature", "0", "--kv-mode", "full", "--json", "--quiet"]))
    assert len(want["generated_ids"]) < 48  # a short answer, then the end token
    def bench(args):
        res = run(args)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    stopped = bench(base)
    assert stopped["ignore_eos"] is False
    for config in stopped["configs"]:
        # The first token comes from the prefill and is not a decode token.
        assert config["domains"]["chat"]["tokens"] == len(want["generated_ids"]) - 1, config
    through = bench(base + ["--ignore-eos"])
    assert through["ignore_eos"] is True
    for config in through["configs"]:
        assert config["domains"]["chat"]["tokens"] == 47, config


def test_router_rules_name_the_domain(specnode, tiny_pair):
    rules = str(ROOT / "bench/prompts/router-rules.json")
    base = [specnode, "generate", "--model", tiny_pair["target"], "--max-tokens", "4",
            "--draft", "ngram", "--router-rules", rules, "--json", "--quiet"]
    for prompt, domain in (("Write a Python function that reverses a list.", "code"),
                           ("What is a good dividend yield for a stock?", "finance"),
                           ("Summarise the following passage: the sea was calm.", "summarize"),
                           ("Tell me a joke about penguins.", "chat")):
        assert last_json(run(base + ["--prompt", prompt]))["domain"] == domain, prompt
    # An explicit --domain wins over the rules.
    got = last_json(run(base + ["--prompt", "def f(): pass", "--domain", "mine"]))
    assert got["domain"] == "mine"


@pytest.mark.parametrize("content,needle", [
    ("{not json", "not valid JSON"),
    ('{"rules": [{"domain": "x", "keywords": [1]}]}', "rules[0].keywords[0]"),
    ('{"rules": [{"domain": "x", "regex": "(unclosed"}]}', "rule 0"),
    ('{"rules": [{"domain": "x", "keyword": ["a"]}]}', "rules[0].keyword: unknown key"),
    ('{"rules": [{"domain": "bad name", "keywords": ["a"]}]}', "bad name"),
])
def test_bad_router_rules(specnode, tiny_pair, tmp_path, content, needle):
    path = tmp_path / "rules.json"
    path.write_text(content)
    res = run([specnode, "generate", "--model", tiny_pair["target"], "--prompt", "hi",
               "--router-rules", str(path)])
    assert res.returncode == 1, res.stderr
    assert needle in res.stderr and "rules.json" in res.stderr, res.stderr


def test_smollm2_suffix_trees_give_target_only_tokens(specnode, real_model, tmp_path):
    """Suffix drafting and token recycling as chains and as draft trees (issue 39) on
    SmolLM2: every configuration, the router included, gives target-only greedy tokens (f16
    and mixed KV), the fixed tree configurations verified trees, and a multi-turn prompt
    ("messages") is encoded whole in the chat template."""
    prompts = tmp_path / "mixed.jsonl"
    lines = [json.loads(line) for line in
             (ROOT / "bench/prompts/edit.jsonl").read_text().splitlines()[:2]]
    lines.append({"domain": "chat", "prompt": "And in one sentence?",
                  "messages": [{"role": "user", "content": "Why is the sky blue?"},
                               {"role": "assistant", "content": "Sunlight scatters off air "
                                "molecules, and blue light scatters the most."},
                               {"role": "user", "content": "And in one sentence?"}]})
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    for kv_mode in ("full", "mixed"):
        res = run([specnode, "spec-bench", "--model", real_model, "--prompts", str(prompts),
                   "--per-domain", "2", "--max-tokens", "48", "--drafters",
                   "ngram,suffix,recycle",
                   "--tree-nodes", "8", "--threads", "2", "--kv-mode", kv_mode, "--json"])
        assert res.returncode == 0, res.stderr
        result = json.loads(res.stdout)
        names = [c["name"] for c in result["configs"]]
        for drafter in ("suffix:8", "recycle:8"):
            assert f"{drafter} tree fixed" in names and f"{drafter} tree adaptive" in names, names
        for config in result["configs"]:
            for domain, d in config["domains"].items():
                assert d["identical_to_target"] == d["prompts"], (kv_mode, config["name"], domain)
        for name in ("suffix:8 tree fixed", "recycle:8 tree fixed"):
            tree = next(c for c in result["configs"] if c["name"] == name)
            assert sum(d["tree_steps"] for d in tree["domains"].values()) > 0, name
        chain = next(c for c in result["configs"] if c["name"] == "suffix:8 fixed")
        assert sum(d["tree_steps"] for d in chain["domains"].values()) == 0


def test_prompt_sets_refuse_bad_messages(specnode, real_model, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"domain": "chat", "prompt": "hi"}) + "\n" +
                   json.dumps({"domain": "chat", "prompt": "hi",
                               "messages": [{"role": "user", "content": "hi"},
                                            {"role": "assistant", "content": "hello"}]}) + "\n")
    res = run([specnode, "spec-bench", "--model", real_model, "--prompts", str(bad),
               "--drafters", "suffix", "--threads", "2", "--json"])
    assert res.returncode != 0
    assert "bad.jsonl:2" in res.stderr and "messages" in res.stderr, res.stderr
