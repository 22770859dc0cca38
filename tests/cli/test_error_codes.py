"""The node's error codes have one source (coordinator/request_error.h): `specnode
error-codes --json` prints it, and client/error_codes.json (what the Python client reads) and
docs/protocol.md's table must say the same. (The HTTP statuses are the node's own: the
OpenAI API answers them, tests/serve/test_openai_http.py.)"""
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "client"))


def node_table(specnode):
    res = subprocess.run([specnode, "error-codes", "--json"], capture_output=True, text=True,
                         timeout=30)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_client_file_is_the_node_table(specnode):
    committed = json.loads((ROOT / "client" / "error_codes.json").read_text())
    assert committed == node_table(specnode), (
        "client/error_codes.json is stale: regenerate it with "
        "`specnode error-codes --json > client/error_codes.json`")


def test_docs_list_every_code_with_its_meaning(specnode):
    doc = (ROOT / "docs" / "protocol.md").read_text()
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| (.+?) \|$", doc, flags=re.M))
    for code, info in node_table(specnode).items():
        assert code in rows, f"docs/protocol.md has no row for {code}"
        assert rows[code] == info["meaning"], (code, rows[code], info["meaning"])


def test_python_client_reads_the_table(specnode):
    import specnode_client
    assert specnode_client.ERROR_CODES == node_table(specnode)


def test_text_listing_names_every_code(specnode):
    res = subprocess.run([specnode, "error-codes"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0
    for code in node_table(specnode):
        assert re.search(rf"^{code}\s+\d{{3}}\s", res.stdout, flags=re.M), code
