#!/usr/bin/env python3
"""image-tar.py OUT REF BINARY: an image of one static binary, without an engine.

Writes OUT in the docker-archive format (what `docker save` writes and
`ctr images import` reads): one layer holding BINARY as /BINARY-NAME, plus
/etc/passwd and /etc/group naming nobody, with the binary as entrypoint,
tagged REF. deploy/local/k8s-node.sh builds the node's pause image with it,
since no registry serves one here. Deterministic: the same binary gives the
same image.
"""
import hashlib
import io
import json
import os
import sys
import tarfile


def entry(tf, name, data=None, mode=0o644, kind=tarfile.REGTYPE):
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.mtime = kind, mode, 0
    if data is not None:
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data))
    else:
        tf.addfile(ti)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__.splitlines()[0])
    out, ref, binary = sys.argv[1:]
    name = os.path.basename(binary)
    with open(binary, "rb") as f:
        program = f.read()
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for d in ("dev", "etc", "proc", "sys"):
            entry(tf, d, mode=0o755, kind=tarfile.DIRTYPE)
        entry(tf, "tmp", mode=0o1777, kind=tarfile.DIRTYPE)
        entry(tf, "etc/passwd", b"root:x:0:0:root:/:/sbin/nologin\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n")
        entry(tf, "etc/group", b"root:x:0:\nnogroup:x:65534:\n")
        entry(tf, name, program, mode=0o755)
    layer = layer.getvalue()
    diff_id = hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
        "config": {"Entrypoint": ["/" + name], "User": "65534:65534", "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "deploy/local/image-tar.py"}],
    }, separators=(",", ":")).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [ref], "Layers": [diff_id + "/layer.tar"]}]).encode()
    with tarfile.open(out + ".tmp", "w") as tf:
        entry(tf, diff_id, mode=0o755, kind=tarfile.DIRTYPE)
        entry(tf, diff_id + "/layer.tar", layer)
        entry(tf, config_name, config)
        entry(tf, "manifest.json", manifest)
    os.replace(out + ".tmp", out)
    print("image-tar: %s (%s) -> %s" % (ref, binary, out))


if __name__ == "__main__":
    main()
