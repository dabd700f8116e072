"""The driver scenario refuses or runs in check mode only: nothing of the driver may be left in the container."""

import pytest


@pytest.mark.parametrize("path", [
    "/etc/apt/sources.list.d/specdec-nvidia-cuda.sources",
    "/etc/apt/preferences.d/specdec-nvidia-driver.pref",
    "/etc/modprobe.d/specdec-blacklist-nouveau.conf",
    "/etc/systemd/system/nvidia-persistenced.service.d/specdec-persistence-mode.conf",
    "/usr/share/keyrings/cuda-archive-keyring.gpg",
])
def test_check_mode_and_refusals_wrote_nothing(host, path):
    assert not host.file(path).exists


def test_the_refused_secure_boot_case_read_a_real_efi_variable_file(host):
    assert host.file("/tmp/SecureBoot-on").size == 5
