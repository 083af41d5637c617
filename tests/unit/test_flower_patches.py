"""The seam to Flower (fedbayes.flowerseam): each patch still rests on the Flower code it was read in, is a function
of the seam, and has its section in docs/reference/flower-patches.md; only the seam touches private Flower."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import flwr
import pytest

from fedbayes.flowerseam import boundary
from fedbayes.flowerseam.patches import FLOWER_DIGESTS, PATCHES, flower_digest
from fedbayes.flowerseam.version import PATCHED_FLOWER

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reference" / "flower-patches.md"


@pytest.mark.parametrize("patch", PATCHES, ids=[patch.name for patch in PATCHES])
def test_the_flower_code_under_each_patch_is_what_it_was_read_in(patch):
    assert flwr.__version__ == PATCHED_FLOWER, (
        f"Flower {flwr.__version__} is installed, the seam is for {PATCHED_FLOWER}"
    )
    changed = [target for target in patch.flower if flower_digest(target) != FLOWER_DIGESTS[target]]
    assert not changed, (
        f"Flower's code under patch fedbayes.flowerseam.{patch.name} changed: re-read {', '.join(changed)} against "
        f"the patch and docs/reference/flower-patches.md#{patch.doc}, then record the new digests in "
        f"fedbayes.flowerseam.patches.FLOWER_DIGESTS ({ {target: flower_digest(target) for target in changed} })"
    )


@pytest.mark.parametrize("patch", PATCHES, ids=[patch.name for patch in PATCHES])
def test_each_patch_is_a_function_of_the_seam_with_its_section_in_the_docs(patch):
    module, _, name = patch.name.rpartition(".")
    assert callable(getattr(importlib.import_module(f"fedbayes.flowerseam.{module}"), name))
    headings = re.findall(r"^#+ (.+)$", DOC.read_text(), flags=re.MULTILINE)
    anchors = {re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-") for heading in headings}
    assert patch.doc in anchors, f"{DOC} has no section #{patch.doc} for {patch.name}"
    assert f"`{patch.name}`" in DOC.read_text(), f"{DOC} does not name {patch.name}"


def test_a_changed_flower_function_is_reported_by_its_patch(tmp_path, monkeypatch):
    """The digest is of the file's text: a Flower whose function reads differently fails, one patched at run time
    does not."""
    (tmp_path / "fakeflower.py").write_text("def pull(initial_backoff=1.0):\n    return initial_backoff\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = flower_digest("fakeflower:pull")
    importlib.import_module("fakeflower").pull.__kwdefaults__ = {"initial_backoff": 0.05}
    assert flower_digest("fakeflower:pull") == before
    (tmp_path / "fakeflower.py").write_text("def pull(initial_backoff=2.0):\n    return initial_backoff\n")
    assert flower_digest("fakeflower:pull") != before
    with pytest.raises(LookupError, match="defines no gone"):
        flower_digest("fakeflower:gone")


def test_nothing_outside_the_seam_references_private_flower():
    assert boundary.references_outside_seam(ROOT) == []


def test_the_boundary_tells_private_flower_from_public():
    source = (
        "import flwr\nfrom flwr.app import Message\nfrom flwr.common import log\nfrom flwr.common import Foo\n"
        "from flwr.supercore.date import now\nimport flwr.cli.build as build\nx = 'flwr.supernode.cli'\n"
        "y = 'flwr.clientapp'\nv = flwr.__version__\n"
    )
    found = [what for _, what in boundary.private_references(source)]
    assert sorted(found) == sorted(
        [
            "from flwr.common import Foo",
            "from flwr.supercore.date import now",
            "import flwr.cli.build",
            "module name 'flwr.supernode.cli'",
            "flwr.__version__",
        ]
    )


def test_a_self_registered_supernode_signs_with_a_p256_key_the_superlink_verifies(monkeypatch):
    from flwr.client.grpc_rere_client import connection
    from flwr.supercore.primitives.asymmetric import (
        bytes_to_public_key,
        public_key_to_bytes,
        sign_message,
        uses_nist_ec_curve,
        verify_signature,
    )

    from fedbayes.flowerseam.supernode import signing_with_p256

    assert connection.generate_key_pairs()[0].curve.name == "secp384r1"  # Flower's own
    monkeypatch.setattr(connection, "generate_key_pairs", connection.generate_key_pairs)  # put back afterwards
    signing_with_p256(connection)
    private, public = connection.generate_key_pairs()
    assert private.curve.name == "secp256r1"
    received = bytes_to_public_key(public_key_to_bytes(public))  # the key as the SuperLink reads it from the node
    stamp = b"2026-12-03T14:00:00+00:00"
    assert uses_nist_ec_curve(received) and verify_signature(received, stamp, sign_message(private, stamp))
    assert not verify_signature(received, b"another stamp", sign_message(private, stamp))
