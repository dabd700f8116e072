"""The stack play leaves the container with a usable interpreter and the shared prefix untouched by root-only paths."""


def test_python_is_present(host):
    assert host.file("/usr/bin/python3").exists
