"""Network modes and collective algorithms: StrEnums defined once, parsed from configs and
flags with the messages users know, one transport strategy per mode."""

import pytest
import simpy

from sim.cli import main
from sim.collectives import ALGORITHM_NAMES, ALGORITHMS, Algorithm, Collectives, parse_algorithm
from sim.config import example_path, load_experiment
from sim.engine.lowering import lower_communication
from sim.engine.replay import replay
from sim.engine.transport import NETWORK_NAMES, Analytic, Flow, Ideal, NetworkMode, transport_for
from traces.errors import ConfigError
from traces.ops import Op, OpKind, Trace

TINY = example_path("gpt-tiny-localhost.toml")


def test_the_names_are_the_enums_values_as_plain_strings():
    assert NETWORK_NAMES == ("flow", "analytic", "ideal")
    assert ALGORITHM_NAMES == ("auto", "ring", "tree", "hierarchical", "rhd", "torus",
                               "direct", "gloo", "ring_flows", "tree_flows")
    assert all(type(n) is str for n in (*NETWORK_NAMES, *ALGORITHM_NAMES))
    # every algorithm but auto has a lowering, in the enum's order (auto's tie-break)
    assert list(ALGORITHMS) == list(Algorithm)[1:]


def test_an_algorithm_flag_is_parsed_or_refused_with_the_list():
    assert parse_algorithm("tree") is Algorithm.TREE
    with pytest.raises(ConfigError) as err:
        parse_algorithm("bogus")
    assert str(err.value) == ("--algo: 'bogus' is not an algorithm (known: auto, ring, tree, "
                              "hierarchical, rhd, torus, direct, gloo, ring_flows, tree_flows)")


def test_a_configs_sim_table_gives_enum_members():
    exp = load_experiment(TINY, {"network": "analytic", "algo": "ring"})
    assert exp.network is NetworkMode.ANALYTIC and exp.algo is Algorithm.RING
    default = load_experiment(TINY)
    assert default.network is NetworkMode.FLOW and default.algo is Algorithm.AUTO


@pytest.mark.parametrize(("overrides", "message"), [
    ({"network": "fast"}, "sim.network: 'fast' is not one of flow, analytic, ideal"),
    ({"network": 1}, "sim.network: 1 is not one of flow, analytic, ideal"),
    ({"algo": "ring/LL128"}, "sim.algo: 'ring/LL128' is not one of auto, ring, tree, "
                             "hierarchical, rhd, torus, direct, gloo, ring_flows, "
                             "tree_flows"),
])
def test_a_bad_mode_or_algorithm_in_a_config_is_todays_message(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_experiment(TINY, overrides)
    assert str(err.value) == message


def test_replay_refuses_an_unknown_mode_string(h100):
    ar = Op(kind=OpKind.ALL_REDUCE, stream="c", group=(0, 1), size_bytes=1.0)
    with pytest.raises(ConfigError, match=r"^network: 'fast' is not one of flow, analytic, "
                                          r"ideal$"):
        replay(Trace({0: (ar,), 1: (ar,)}), h100, None, network="fast")


def test_each_mode_has_its_transport(h100):
    ar = Op(kind=OpKind.ALL_REDUCE, stream="c", group=(0, 1), size_bytes=2.0**20)
    comm = lower_communication(Trace({0: (ar,), 1: (ar,)}), h100, None)
    env = simpy.Environment()
    kinds = {mode: type(transport_for(mode, env, h100, comm)) for mode in NetworkMode}
    assert kinds == {NetworkMode.FLOW: Flow, NetworkMode.ANALYTIC: Analytic,
                     NetworkMode.IDEAL: Ideal}
    assert transport_for(NetworkMode.IDEAL, env, h100, comm).move(0, ar, 1.0, 0.0) is None
    analytic = transport_for(NetworkMode.ANALYTIC, env, h100, comm).move(0, ar, 2.0, 1e-3)
    env.run()
    alone = Analytic(simpy.Environment(), h100, comm)
    assert analytic.ok and env.now > 1e-3
    assert env.now == 1e-3 + 2.0 * _seconds(alone, ar)


def _seconds(transport, op):
    event = transport.move(0, op, 1.0, 0.0)
    event.env.run()
    return event.env.now


def test_a_resolved_algorithm_is_a_plain_name(h100):
    name, _ = Collectives(h100).resolve(OpKind.ALL_REDUCE, range(8), 2.0**20,
                                        Algorithm.TREE_FLOWS)
    assert type(name) is str and name == "tree_flows"
    name, _ = Collectives(h100).resolve(OpKind.ALL_REDUCE, range(8), 2.0**20, Algorithm.TREE)
    assert type(name) is str and name.startswith("tree/")  # NCCL's tree where NCCL runs


def test_the_collective_commands_flags_keep_their_messages(capsys):
    assert main(["collective", "--algo", "bogus", "--sizes", "1M"]) == 2
    assert "--algo: 'bogus' is not an algorithm (known: auto, ring," in capsys.readouterr().err
    assert main(["collective", "--sizes", "1M", "--model", "ideal"]) == 2
    assert "invalid choice: 'ideal' (choose from 'flow', 'analytic')" in capsys.readouterr().err
