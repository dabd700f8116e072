#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: openpgp_keyring
short_description: Put an apt repository keyring in place only when its keys have the pinned fingerprints
version_added: 0.1.0
description:
  - Reads the OpenPGP public keys of the keyring at O(path) (binary or ASCII-armored) and computes the fingerprint
    of each primary key (version 4 and version 6 keys) without gpg, which a minimal host may lack.
  - An existing file is kept only when every primary key in it has one of O(fingerprints); any other file fails the
    task with one line and is left as it is.
  - A missing file is downloaded from O(url), checked the same way before anything is written, and written
    atomically (binary, mode C(0644), owned by root when the module runs as root). Nothing is written when the
    download holds any other key.
author:
  - specdec developers (!UNKNOWN)
options:
  path:
    description: Absolute path of the keyring file that the apt source names in C(Signed-By).
    type: path
    required: true
  url:
    description: Where a missing keyring is downloaded from. Empty to require the file to exist already.
    type: str
    default: ""
  fingerprints:
    description:
      - The accepted primary-key fingerprints (40 or 64 hex digits; spaces are ignored, case does not matter).
    type: list
    elements: str
    required: true
  name:
    description: What the keyring is, for the messages (e.g. V(NVIDIA's CUDA repository key)).
    type: str
    default: the repository key
attributes:
  check_mode:
    support: full
    description: An existing file is checked as in a real run; a missing one is reported as a download that would happen.
  diff_mode:
    support: none
    description: The keyring is binary; no diff is shown.
  idempotent:
    support: full
    description: A keyring with the pinned keys is left alone (C(changed=false)).
notes:
  - Subkeys are not compared; apt's C(Signed-By) trusts a primary key together with its subkeys.
seealso:
  - module: ansible.builtin.get_url
"""

EXAMPLES = r"""
- name: Put NVIDIA's archive keyring in place, checked against its pinned fingerprint
  specdec.eagle3.openpgp_keyring:
    path: /usr/share/keyrings/cuda-archive-keyring.gpg
    url: https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-archive-keyring.gpg
    fingerprints: [EB693B3035CD5710E231E123A4B469963BF863CC]
    name: NVIDIA's CUDA repository key
"""

RETURN = r"""
fingerprints:
  description: The primary-key fingerprints of the keyring that is (or would be) in place, upper-case hex.
  returned: success
  type: list
  elements: str
  sample: [EB693B3035CD5710E231E123A4B469963BF863CC]
"""

import base64
import binascii
import hashlib
import os
import re
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import fetch_url

MAX_BYTES = 1 << 20
PUBLIC_KEY_TAG = 6


class KeyringError(ValueError):
    """The bytes are not an OpenPGP keyring this module can read."""


def dearmor(data):
    """The binary packets of an ASCII-armored block, or the data unchanged when it is binary already."""
    if not data.lstrip().startswith(b"-----BEGIN PGP"):
        return data
    lines = data.decode("ascii", "replace").splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("-----BEGIN PGP"))
        end = next(i for i, line in enumerate(lines) if line.startswith("-----END PGP"))
    except StopIteration:
        raise KeyringError("an armored block without its END line") from None
    body = lines[start + 1:end]
    while body and ":" in body[0]:  # armor headers, then one empty line
        body.pop(0)
    text = "".join(line.strip() for line in body if line.strip() and not line.startswith("="))
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise KeyringError("armored text that is not base64") from None


def packets(data):
    """(tag, body) of each OpenPGP packet (RFC 9580 section 4.2, old and new header formats)."""
    pos = 0
    while pos < len(data):
        head = data[pos]
        pos += 1
        if not head & 0x80:
            raise KeyringError("byte %d is not a packet header" % (pos - 1))
        if head & 0x40:
            tag = head & 0x3F
            if pos >= len(data):
                raise KeyringError("a packet header without its length")
            first = data[pos]
            if first < 192:
                length, pos = first, pos + 1
            elif first < 224:
                if pos + 1 >= len(data):
                    raise KeyringError("a truncated packet length")
                length, pos = ((first - 192) << 8) + data[pos + 1] + 192, pos + 2
            elif first == 255:
                length, pos = int.from_bytes(data[pos + 1:pos + 5], "big"), pos + 5
            else:
                raise KeyringError("a partial-length packet, which keys never use")
        else:
            tag = (head >> 2) & 0x0F
            size = {0: 1, 1: 2, 2: 4}.get(head & 0x03)
            if size is None:
                raise KeyringError("an old-format packet of indeterminate length")
            length, pos = int.from_bytes(data[pos:pos + size], "big"), pos + size
        if pos + length > len(data):
            raise KeyringError("a packet that runs past the end of the file")
        yield tag, data[pos:pos + length]
        pos += length


def fingerprint(body):
    """The fingerprint of a public-key packet body: SHA-1 for version 4 keys, SHA-256 for version 6."""
    version = body[0] if body else None
    if version == 4:
        return hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body).hexdigest().upper()
    if version == 6:
        return hashlib.sha256(b"\x9b" + len(body).to_bytes(4, "big") + body).hexdigest().upper()
    raise KeyringError("a version %s public key, which this module does not read" % version)


def primary_fingerprints(data):
    """The fingerprints of the primary keys in a keyring (binary or armored)."""
    found = [fingerprint(body) for tag, body in packets(dearmor(data)) if tag == PUBLIC_KEY_TAG]
    if not found:
        raise KeyringError("no public key")
    return found


def normalise(value):
    return re.sub(r"\s+", "", str(value)).upper()


def verdict(found, wanted, where, name):
    """None when every primary key is pinned, else the one-line reason."""
    stray = [fpr for fpr in found if fpr not in wanted]
    if not stray:
        return None
    return ("%s holds the key %s, not %s (%s)" % (where, ", ".join(stray), " or ".join(sorted(wanted)), name))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            url=dict(type="str", default=""),
            fingerprints=dict(type="list", elements="str", required=True),
            name=dict(type="str", default="the repository key"),
        ),
        supports_check_mode=True,
    )
    path, url, name = module.params["path"], module.params["url"], module.params["name"]
    wanted = {normalise(f) for f in module.params["fingerprints"]}
    bad = sorted(f for f in wanted if not re.match(r"^([0-9A-F]{40}|[0-9A-F]{64})$", f))
    if not wanted or bad:
        module.fail_json(msg="openpgp_keyring: fingerprints must be 40 or 64 hex digits (got %s); copy the full "
                             "fingerprint of %s." % (", ".join(bad) or "none", name))
    if not os.path.isabs(path):
        module.fail_json(msg="openpgp_keyring: path must be absolute (got '%s')." % path)

    if os.path.lexists(path):
        if os.path.islink(path) or not os.path.isfile(path):
            module.fail_json(msg="%s is not a regular file; nothing was changed. Remove it, then run again so that "
                                 "%s is downloaded and checked." % (path, name))
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
        try:
            found = primary_fingerprints(data)
        except KeyringError as exc:
            module.fail_json(msg="%s is not an OpenPGP keyring (%s); nothing was changed. Remove it, then run again "
                                 "so that %s is downloaded and checked." % (path, exc, name))
        reason = verdict(found, wanted, path, name)
        if reason:
            module.fail_json(msg="%s; nothing was changed. Remove the file (or put the pinned key there), then run "
                                 "again." % reason, fingerprints=found)
        module.exit_json(changed=False, fingerprints=found)

    if not url:
        module.fail_json(msg="%s does not exist and no url to download %s from was given." % (path, name))
    if module.check_mode:
        module.exit_json(changed=True, fingerprints=sorted(wanted),
                         msg="Check mode: %s would be downloaded to %s and checked." % (url, path))
    response, info = fetch_url(module, url, timeout=60)
    if response is None or info.get("status", 200) not in (200, None):
        module.fail_json(msg="%s could not be downloaded from %s (%s); nothing was written." % (
            name, url, info.get("msg", "no answer")))
    data = response.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        module.fail_json(msg="%s from %s is larger than %d bytes, which no keyring is; nothing was written." % (
            name, url, MAX_BYTES))
    try:
        binary = dearmor(data)
        found = primary_fingerprints(binary)
    except KeyringError as exc:
        module.fail_json(msg="%s from %s is not an OpenPGP keyring (%s); nothing was written." % (name, url, exc))
    reason = verdict(found, wanted, url, name)
    if reason:
        module.fail_json(msg="%s; nothing was written to %s. Check the URL (a mirror may serve another key) or, if "
                             "the vendor rotated its key, the pinned fingerprint." % (reason, path), fingerprints=found)
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        module.fail_json(msg="%s: the directory %s does not exist; nothing was written." % (path, directory))
    fd, tmp = tempfile.mkstemp(prefix=".specdec-keyring-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(binary)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        module.atomic_move(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    module.exit_json(changed=True, fingerprints=found)


if __name__ == "__main__":
    main()
