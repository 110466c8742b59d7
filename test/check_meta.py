#!/usr/bin/python3
"""Checks the PGXN META.json of a source tree, and debian/changelog, against its control file.

usage: test/check_meta.py [SOURCE_DIR]

The fields PGXN's meta spec requires are present, the versions are the control
file's default_version as semantic versions (1.0 -> 1.0.x), and every file that
`provides` names is in the tree; the Debian package's upstream version (the latest
entry of debian/changelog, before the Debian revision) is META.json's version.
Prints what is wrong and exits 1, or one line.
"""
import json
import pathlib
import re
import sys

REQUIRED = ("name", "abstract", "version", "maintainer", "license", "provides", "meta-spec")


def problems(src: pathlib.Path) -> list:
    meta = json.loads((src / "META.json").read_text())
    control = (src / f"{meta.get('name', '')}.control")
    if not control.is_file():
        return [f"no control file {control.name} for name {meta.get('name')!r}"]
    version = re.search(r"^default_version = '(.*)'", control.read_text(), re.M).group(1)
    found = [f"missing field {field}" for field in REQUIRED if field not in meta]
    versions = {"version": meta.get("version", "")}
    for name, item in meta.get("provides", {}).items():
        versions[f"provides.{name}.version"] = item.get("version", "")
        if not (src / item.get("file", "")).is_file():
            found.append(f"provides.{name}.file {item.get('file')!r} is not in the source")
    for field, value in versions.items():
        if not value.startswith(version + "."):
            found.append(f"{field} {value!r} is not the control file's {version} (as {version}.x)")
    changelog = src / "debian" / "changelog"
    if changelog.is_file():
        latest = re.match(r"\S+ \(([^)]*)\)", changelog.read_text())
        upstream = latest.group(1).rsplit("-", 1)[0] if latest else ""
        if upstream != meta.get("version"):
            found.append(f"debian/changelog's version {upstream!r} is not META.json's "
                         f"{meta.get('version')!r}")
    return found


def main() -> int:
    src = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    found = problems(src)
    for problem in found:
        print(f"META.json: {problem}")
    if not found:
        print(f"META.json agrees with the control file in {src.resolve()}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
