"""Issue 36's hostile sweep: `search --ray` toward an address where no cluster answers retried
for minutes with Ray's multi-line warnings and ignored SIGTERM. The address is now checked by
one TCP connection first: one line, exit 2."""

from __future__ import annotations

import socket

import pytest

from sim.cli import main
from sim.search import ray_address
from sim.search.ray_address import check_reachable, host_port
from tests.sim.search.search_cases import SMALL_TOML
from traces.errors import ConfigError

pytest.importorskip("ray")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SMALL_TOML)
    return str(path)


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_a_closed_port_is_one_line(config, capsys, scheme):
    address = f"{scheme}127.0.0.1:{closed_port()}"
    code = main(["search", config, "--ray", address])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err == (f"parasim: error: --ray: no Ray cluster answers at {address}: "
                   "Connection refused\n")


def test_an_address_that_never_answers_is_one_line_after_the_timeout(config, capsys,
                                                                      monkeypatch):
    def silent(address, timeout):
        assert timeout == ray_address.CONNECT_TIMEOUT_S
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", silent)
    code = main(["search", config, "--ray", "10.255.255.1:6379"])
    _, err = capsys.readouterr()
    assert code == 2
    assert err == ("parasim: error: --ray: no Ray cluster answers at 10.255.255.1:6379 (no "
                   "reply within 5 s)\n")


@pytest.mark.parametrize("address", ["nohost", "host:", ":6379", "host:0", "host:65536",
                                     "host:port", "ray://"])
def test_an_address_that_is_not_host_port_is_refused(address):
    with pytest.raises(ConfigError, match="is not HOST:PORT, ray://HOST:PORT or auto"):
        host_port(address)


@pytest.mark.parametrize(("address", "parts"), [("head:6379", ("head", 6379)),
                                                ("ray://10.0.0.1:10001", ("10.0.0.1", 10001)),
                                                ("[::1]:6379", ("::1", 6379))])
def test_host_port_reads_the_forms_ray_takes(address, parts):
    assert host_port(address) == parts


def test_a_listening_port_passes_and_auto_is_left_to_ray():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}")
    check_reachable("auto")
