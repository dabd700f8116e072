"""The toolkit scenario refuses or runs in check mode only: no toolkit, source or profile may be left behind."""

import pytest


@pytest.mark.parametrize("path", [
    "/etc/apt/sources.list.d/specdec-nvidia-cuda.sources",
    "/etc/profile.d/specdec-cuda.sh",
    "/usr/share/keyrings/cuda-archive-keyring.gpg",
    "/usr/local/cuda",
])
def test_nothing_was_installed_or_written(host, path):
    assert not host.file(path).exists
