"""Write the image's provenance: its lock, the lock's sha256, the git revision and an SBOM.

Run by the Dockerfile with the runtime venv's python, after the installs and docker/slim:
    python docker/provenance.py --lock LOCK --revision REV --variant cpu --out DIR
Nothing written depends on the build's time or machine, so the image stays reproducible.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from importlib import metadata
from pathlib import Path

DPKG_STATUS = Path("/var/lib/dpkg/status")


def python_components() -> list[dict[str, object]]:
    """Every distribution the venv's python sees, as CycloneDX components."""
    seen = {(d.metadata["Name"], d.version) for d in metadata.distributions()}
    return [
        {
            "type": "library",
            "name": name,
            "version": version,
            "purl": f"pkg:pypi/{name.lower().replace('_', '-')}@{version}",
        }
        for name, version in sorted(seen, key=lambda item: (item[0].lower(), item[1]))
    ]


def debian_components(status: Path) -> list[dict[str, object]]:
    """The installed Debian packages of the base, as CycloneDX components."""
    if not status.exists():
        return []
    found = []
    for stanza in status.read_text().split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " "
        )
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            name, version, arch = fields["Package"], fields["Version"], fields["Architecture"]
            found.append(
                {
                    "type": "library",
                    "name": name,
                    "version": version,
                    "purl": f"pkg:deb/debian/{name}@{version}?arch={arch}",
                }
            )
    return sorted(found, key=lambda item: str(item["name"]))


def sbom(provenance: dict[str, str], components: list[dict[str, object]]) -> dict[str, object]:
    """A CycloneDX 1.5 document with no timestamp or serial number (both would differ per build)."""
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {
            "component": {
                "type": "container",
                "name": "trainbox",
                "version": provenance["revision"],
            },
            "properties": [{"name": f"trainbox:{k}", "value": v} for k, v in provenance.items()],
        },
        "components": components,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    for flag in ("--lock", "--revision", "--variant", "--out"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args()
    lock, out = Path(args.lock), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(lock, out / "requirements.lock")
    provenance = {
        "lock": lock.name,
        "lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest(),
        "revision": args.revision,
        "variant": args.variant,
    }
    (out / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
    document = sbom(provenance, python_components() + debian_components(DPKG_STATUS))
    (out / "sbom.cdx.json").write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
