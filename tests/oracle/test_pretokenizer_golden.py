"""tests/data/pretokenizer_golden.json (read by tokenizer_test's PreTokenizeTest.MatchesHfTokenizers)
is what Hugging Face `tokenizers` says today: regenerated in memory and compared, so the
C++ test's reference cannot drift from its source."""
import importlib.util
import json
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"


def test_committed_golden_is_what_tokenizers_splits():
    spec = importlib.util.spec_from_file_location("make_pretokenizer_golden",
                                                  DATA / "make_pretokenizer_golden.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    committed = json.loads((DATA / "pretokenizer_golden.json").read_text(encoding="utf-8"))
    assert committed["cases"] == mod.golden()["cases"], \
        "run tests/data/make_pretokenizer_golden.py and review the diff"
