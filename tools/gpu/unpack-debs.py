#!/usr/bin/env python3
"""Unpacks every .deb in a folder into a prefix, like `dpkg-deb -x`, without dpkg.

The GPU machine may not be a Debian system: a .deb is an ar archive whose data.tar.{xz,gz}
member holds the files, which Python's standard library can read. Symlinks (libfoo.so ->
libfoo.so.N) are kept; nothing is installed system-wide and no maintainer script runs.

Usage: unpack-debs.py DEBS_DIR PREFIX
"""
import os
import io
import sys
import tarfile


def ar_members(path):
    """Yields (name, bytes) for each member of a System V ar archive."""
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise ValueError(f"{path}: not an ar archive (not a .deb?)")
        while True:
            header = f.read(60)
            if len(header) < 60:
                return
            name = header[:16].decode().strip().rstrip("/")
            size = int(header[48:58].decode().strip())
            data = f.read(size)
            if size % 2:
                f.read(1)
            yield name, data


def unpack(deb, prefix):
    for name, data in ar_members(deb):
        if not name.startswith("data.tar"):
            continue
        if name.endswith(".zst"):
            raise ValueError(f"{deb}: zstd-compressed data; unpack it with dpkg-deb -x")
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            for member in tar.getmembers():
                target = os.path.realpath(os.path.join(prefix, member.name))
                root = os.path.realpath(prefix)
                if target != root and not target.startswith(root + os.sep):
                    raise ValueError(f"{deb}: member {member.name} escapes the prefix")
            # Python >= 3.12 asks for an extraction filter; "tar" keeps symlinks as dpkg does.
            extra = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
            tar.extractall(prefix, **extra)
        return
    raise ValueError(f"{deb}: no data.tar member")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    debs_dir, prefix = sys.argv[1], sys.argv[2]
    debs = sorted(f for f in os.listdir(debs_dir) if f.endswith(".deb"))
    if not debs:
        sys.exit(f"unpack-debs: no .deb files in {debs_dir} (run tools/gpu/fetch-debs.sh)")
    os.makedirs(prefix, exist_ok=True)
    for deb in debs:
        unpack(os.path.join(debs_dir, deb), prefix)
    print(f"unpack-debs: {len(debs)} packages into {prefix}")


if __name__ == "__main__":
    main()
