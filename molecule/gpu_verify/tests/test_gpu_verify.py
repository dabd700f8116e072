"""gpu_verify only reads: the container is left without any NVIDIA file or package."""


def test_no_nvidia_tools_were_installed(host):
    assert not host.exists("nvidia-smi")
    assert not host.package("nvidia-open").is_installed


def test_no_apt_source_or_pin_was_written(host):
    assert not host.file("/etc/apt/sources.list.d/specdec-nvidia-cuda.sources").exists
    assert not host.file("/etc/apt/preferences.d/specdec-nvidia-driver.pref").exists


def test_the_gpu_check_cli_reports_the_missing_driver_in_the_container(host):
    # gpu_check.py and the module_utils file it loads run on their own (as on a GPU host without Ansible);
    # the test copies both into one folder of the container itself.
    import base64
    from pathlib import Path
    root = Path(__file__).resolve().parents[3]
    host.run("mkdir -p /tmp/specdec-test")
    for src in (root / "roles" / "gpu_verify" / "files" / "gpu_check.py",
                root / "plugins" / "module_utils" / "gpu_inventory.py"):
        payload = base64.b64encode(src.read_bytes()).decode()
        assert host.run(f"echo {payload} | base64 -d > /tmp/specdec-test/{src.name}").rc == 0
    result = host.run("python3 /tmp/specdec-test/gpu_check.py --expect-count 1 --expect-cc 9.0")
    assert result.rc == 2
    assert result.stdout.strip() == ("No NVIDIA GPU can be checked: nvidia-smi is not installed "
                                     "(install the NVIDIA driver first).")
