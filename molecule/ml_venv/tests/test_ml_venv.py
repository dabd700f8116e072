"""uv from PyPI in its tool venv, the ML venv from the container's own Python, nothing system-wide."""


def test_uv_lives_in_its_tool_venv(host):
    assert host.check_output("/opt/specdec/tools/uv/bin/uv --version").split()[1] == "0.13.9"
    assert not host.exists("uv") or host.find_command("uv").startswith("/opt/specdec/")


def test_venv_is_built_from_the_container_python(host):
    cfg = host.file("/opt/specdec/ml-env/pyvenv.cfg").content_string
    assert "uv = " in cfg
    assert "version_info = 3.13" in cfg


def test_venv_has_pip_seeded(host):
    assert host.run("/opt/specdec/ml-env/bin/python -m pip --version").rc == 0


def test_missing_interpreter_left_nothing_behind(host):
    assert not host.file("/opt/specdec/other-env").exists


def test_unpinned_uv_wheel_left_no_uv_and_no_venv(host):
    assert not host.file("/opt/specdec/tools/uv-unpinned/bin/uv").exists
    assert not host.file("/opt/specdec/unpinned-env").exists


def test_no_ca_variable_in_the_container(host):
    env = host.check_output("env")
    assert "SSL_CERT_FILE=" not in env and "PIP_CERT=" not in env and "REQUESTS_CA_BUNDLE=" not in env
